"""LMDB only: the schema, a transaction made of tables, the reader, migration and fsck."""

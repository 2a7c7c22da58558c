"""The broker's state machine, sans-IO: `Broker.step(ops, open_subs, now_ns)` applies a step's ops in one store transaction and returns what to send; no sockets, threads or clock here."""

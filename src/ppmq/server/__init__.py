"""The broker as a process: asyncio listeners and connections, the group commit, push to subscribers, PHPMQ, the journal, metrics; daemon.py composes them."""

"""The OPC UA side of the line: the stations' server (`server.py`, asyncua), its door (`guard.py`:
channels, sessions and logins refused), certificates and users (`pki.py`), session tokens bound to
their channel (`sessions.py`), and asyncua's own log lines limited (`asyncua_logs.py`)."""

"""Scale-out: offload and escalation of inspections to central OpenAI-compatible servers (vLLM, …).

Kept import-light on purpose: `config.py` imports `offload.config`, so this package must not pull in
the scheduler (which imports `config`) at import time. Import `offload.router` where it is wired.
"""

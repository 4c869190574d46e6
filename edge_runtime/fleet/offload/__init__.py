"""Scale-out: offload and escalation of inspections to central OpenAI-compatible servers (vLLM, …).

Kept import-light on purpose (its config is `config/offload.py`): importing the package loads nothing;
import `fleet.offload.router` where it is wired.
"""

"""`edge-runtime eval`: a bundle, prompt and schema measured on labelled images.

dataset (readers, each bad record one counted line) -> runner (the real inspection path, resumable
`runs.jsonl`) -> metrics (per field, the defect decision with Wilson intervals, confidence, McNemar)
-> report (one self-contained HTML file and `report.json`). See docs/evaluation.md.
"""

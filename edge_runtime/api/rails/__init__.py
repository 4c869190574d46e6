"""Rails of `/v1/chat/completions` and `POST /api/v1/infer` (config `rails:`, config/rails.py).

Input rails run on the request before an image is decoded or a token generated; output rails on the
answer before a byte of it is sent. Every refusal is a `RailRefused` whose code names the rail
(`rail_input_text_length`); it is logged once at INFO with the request id and counted on /metrics per
rail and action (`edge_rail_fired_total`). The rails are compiled once per config object and read
from the live config per request, so a reload that changes them applies from the next request.
JSON-field conditions are the rules engine's own (`verdicts/rules.condition_holds`).
"""

"""The one HTTP edge: what every HTTP server of Podium (the instance, the gateway, the control
API) does to a request before a route reads it, one copy each.

    head.py         the request line and headers bounded as they arrive (431)
    body.py         the body read whole, capped (413) and, where asked, bounded in stall (408)
    inflate.py      gzip / deflate undone in memory, capped (413), bombs refused early
    json_checks.py  a parsed JSON value's depth and text (400)

The edge decides *when* to refuse; *what* a refusal says is the surface's: each job takes a
wording (`BodyWording`, `InflateWording`) or returns a value (`JsonIssue`) that the surface
renders in its own shape. It imports `podium.errors` only (and uvicorn, in `head`).
"""

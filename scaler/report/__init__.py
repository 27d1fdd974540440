"""Pictures of what the scaler did: a function's timeline folded from its events (timeline.py) and the
Plotly figures and self-contained page that draw it (draw.py).

Shared by `scaler simulate --report` (scaler/simulator/report.py) and `scaler replay --html`
(scaler/replay/page.py), so it depends only on proto and controller.core, and on Plotly.
"""

"""Pictures of what the scaler did: a function's timeline folded from its events (timeline.py) and the
Plotly figures and the page that draw them, plotly.js in a file beside it (draw.py).

Shared by `scaler simulate --report` (scaler/simulator/report.py) and `scaler replay --html`
(scaler/replay/page.py), so it depends only on proto and controller.core, and on Plotly.
"""

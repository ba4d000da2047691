"""Presentation: tidy frames and pure DataFrame -> plotly figure functions (`plots`), and the
self-contained HTML report (`report`). The dashboard, the report and the CLI share them.
"""

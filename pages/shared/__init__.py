"""The dashboard code the page scripts share, one module a job. Page scripts (pages/*.py,
listed in app.py) only draw; these modules are not pages (Streamlit's folder navigation lists
pages/*.py alone, never a subfolder).

    startup       the start-up setting (TRUST_CODE); freezes the imports out of the GC
    workspace     the model and data in use: demos and uploads, loaded and cached; clusters
    progress      ProgressLine: "what: 40% done · about 12 s left" for long computations
    keys          cache keys (no streamlit)
    context       Context: what every page works on, and the cached calls made through it
    url           the page address: choices written into it, a link's choices applied once
    sidebar       the sidebar's choices, their defaults and the Context they imply
    routing       app.py runs every page; switching pages keeps the choices
    curve_states  the Pruning page's state machine for one curve (no streamlit)
    figures       drawn_once: plotly.js's defaults written into a figure (no streamlit)
    draw          chart, show_error, guarded, escape_markdown
"""

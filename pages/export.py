"""Share & export page: the link that reproduces this view, and one offline HTML report of
it (charts, settings, findings) plus its tables as CSVs."""
import io
import zipfile
from urllib.parse import urlencode

import pandas as pd
import streamlit as st

import attribution as at
from attribution.progress import TimeLeft
from attribution.presentation.report import (assemble, image_examples, model_facts, render_report,
                                            report_csvs)
from pages.shared.context import context
from pages.shared.draw import guarded
from pages.shared.routing import require_entrypoint

require_entrypoint()

ctx = context()
s = ctx.settings

st.title("Share & export")

st.subheader("Share this view")
st.markdown("Every choice in the sidebar is part of the page address, so a link opens the same "
            "layer, clusters, cluster, methods and settings. Uploaded files are not part of "
            "the link: the recipient uploads the same files.")
app_address = (st.context.url or "").split("?")[0].rsplit("/", 1)[0] + "/"
st.code(f"{app_address}?{urlencode(st.query_params.to_dict())}", language=None,
        wrap_lines=True)

st.subheader("Report")
st.markdown("One HTML file that opens offline in any browser: the settings, the model "
            "summary, the findings, the heatmap, ranked neurons, method comparison, pruning "
            "curves and the agreement with ablation, with interactive charts. The CSV bundle "
            "holds every table.")
described = s.describe(ctx.ws.class_names)  # names from the data: a table of plain text
st.dataframe(pd.DataFrame({"setting": list(described), "value": list(described.values())}),
             hide_index=True, width="content")

key = ctx.curve_key() + (s.methods,)
built = st.session_state.get("report")
if st.button("Build report", type="primary", icon=":material/description:"):
    progress = st.progress(0.0, text="Scoring neurons…")

    def build():
        per_sample = {m: ctx.scores(m) for m in s.methods}
        progress.progress(0.2, text="Pruning curves…")
        finished = st.session_state.setdefault("curves", {})
        curves = finished.get(ctx.curve_key())
        if curves is None:  # the Pruning page's curves: the same settings, the same call
            time_left = TimeLeft()

            def on_curve(fraction, _) -> None:
                words = time_left.words(fraction)
                progress.progress(0.2 + 0.4 * fraction, text=f"Pruning curves: {words}…"
                                  if words else "Pruning curves…")

            curves = ctx.pruning_curves(progress=on_curve)
            finished[ctx.curve_key()] = curves
        progress.progress(0.6, text="Degeneracy checks…")
        findings = ctx.findings()
        progress.progress(0.7, text="Agreement with ablation…")
        oracle = ctx.oracle(at.method_names())
        progress.progress(0.8, text="Which method to trust, every layer…")
        card = ctx.scorecard()
        content = assemble(
            s, title=f"Neuron importance: {ctx.ws.title}, layer {s.layer}",
            facts=model_facts(ctx.ws.loaded, ctx.ws.data, ctx.predictions()),
            layers=ctx.ws.layers, per_sample=per_sample, clusters=ctx.clusters, curves=curves,
            findings=findings, oracle=oracle, scorecard=card, class_names=ctx.ws.class_names,
            method_notes={m: fit[0] for m in s.methods if (fit := ctx.fit_note(m))},
            one_output=ctx.regression,
            examples_of=lambda neuron: image_examples(
                ctx.ws.model, s.layer, ctx.ws.data, per_sample[s.method],
                ctx.scores("activation"), ctx.focus, neuron))
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
            for name, text in report_csvs(content).items():
                bundle.writestr(name, text)
        return render_report(content).encode(), archive.getvalue()

    result = guarded(build)
    progress.empty()
    if result is not None:
        built = st.session_state["report"] = (key, *result)

if built is not None and built[0] == key:
    columns = st.columns([1, 1, 2])
    columns[0].download_button("Download report (HTML)", built[1], file_name="report.html",
                               mime="text/html", icon=":material/download:", on_click="ignore")
    columns[1].download_button("Download tables (CSV, zip)", built[2],
                               file_name="report_tables.zip", mime="application/zip",
                               icon=":material/download:", on_click="ignore")
    st.caption(f"Report ready: {len(built[1]) / 2**20:.1f} MB (plotly.js is embedded so it "
               "works offline).")
elif built is not None:
    st.info("The choices changed since the last report; build it again.")

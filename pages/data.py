"""Model & data page: upload a model and data, see what was loaded (architecture, classes,
accuracy, cluster sizes), and download sample files that show the accepted layouts."""
from dataclasses import replace

import numpy as np
import pandas as pd
import streamlit as st

import attribution as at
from attribution.presentation.report import layers_frame, model_facts
from pages.shared.draw import escape_markdown, show_error
from pages.shared.routing import require_entrypoint
from pages.shared.startup import TRUST_CODE
from pages.shared.workspace import Upload, validate_upload, warm_up

require_entrypoint()

MODEL_TYPES = ["pt2", "pt", "pth", "safetensors", "zip"]
ARCHITECTURE_TYPES = ["json", "yaml", "yml"] + (["py"] if TRUST_CODE else [])
DATA_TYPES = ["npz", "npy", "pt", "csv", "parquet"]

st.title("Model & data")
warm_up()  # the checker of uploaded models starts while files are chosen

st.subheader("Upload your own")
st.markdown(
    "**Model:** a `torch.export` program (`.pt2`, recommended: no code needed), or a state "
    "dict (`.pt`, `.pth`, `.safetensors`) together with an architecture description "
    "(`.json`/`.yaml`, see the samples below), or a Hugging Face `save_pretrained` folder as a "
    "`.zip` (`config.json` + `model.safetensors`; transformers' own classifier classes, no "
    "code from the folder). **Data:** `.npz`, `.npy`, `.pt`, `.csv` or `.parquet` with "
    "inputs, labels and optionally a cluster column; for a folder with a `tokenizer.json`, "
    "a table's text column is tokenized, and a `.npz` may hold `input_ids` and "
    "`attention_mask`.")
st.caption("Uploaded files are read, and a model first run, in a jail: "
           f"{at.inputs.untrusted.jail.isolation()}. Only the plain arrays and facts it "
           "hands back reach this app.")
if TRUST_CODE:
    st.warning("Started with --trust-code: pickled models and Python architecture files run "
               "code. Only upload your own files.", icon=":material/gpp_maybe:")
columns = st.columns(3)
model_file = columns[0].file_uploader("Model file", type=MODEL_TYPES, key="model_file")
architecture_file = columns[1].file_uploader("Architecture (state dicts only)",
                                             type=ARCHITECTURE_TYPES, key="architecture_file")
data_file = columns[2].file_uploader("Data file", type=DATA_TYPES, key="data_file")
in_use = st.session_state.get("upload")
if "image_shape" not in st.session_state:  # a widget's value is dropped while off the page
    st.session_state["image_shape"] = in_use.image_shape if in_use is not None else ""
image_shape = columns[2].text_input(
    "Image shape (optional)", key="image_shape", placeholder="e.g. 8x8 or 3x32x32",
    help="For a table of pixels: draw each sample as an image of this shape (height x "
         "width, or channels x height x width). A .npz or .pt may say it itself, in an "
         "image_shape array.").strip()

upload = None
if model_file is not None and data_file is not None:
    upload = Upload(
        model_file.name, model_file.getvalue(),
        architecture_file.name if architecture_file is not None else None,
        architecture_file.getvalue() if architecture_file is not None else None,
        data_file.name, data_file.getvalue(), image_shape)
elif model_file is None and data_file is None and in_use is not None \
        and image_shape != in_use.image_shape:  # the files in use, drawn another way
    upload = replace(in_use, image_shape=image_shape)
if upload is not None:
    attempt = st.session_state.get("upload_attempt")
    if attempt is None or attempt[0] != upload.key:
        try:
            validate_upload(upload)
            st.session_state["upload_attempt"] = (upload.key, None)
            st.session_state["upload"] = upload
            st.session_state["upload_is_new"] = True
            st.rerun()
        except at.AttributionError as error:
            st.session_state["upload_attempt"] = (upload.key, str(error))
    message = st.session_state["upload_attempt"][1]
    if message is not None:
        show_error(message, before="These files could not be used: ")
        st.caption("The app keeps working on the previous model and data.")
elif model_file is not None or data_file is not None:
    st.info("Upload both a model file and a data file to analyse them.")

ctx = st.session_state.get("context")
if ctx is not None:
    st.subheader("In use now")
    st.text(ctx.ws.title)
    facts = model_facts(ctx.ws.loaded, ctx.ws.data, ctx.predictions())
    metrics = st.columns(4)
    metrics[0].metric("Samples", facts["samples"])
    metrics[1].metric("Classes", facts["classes"].split(" (")[0])
    if "RMSE on this data" in facts:  # a regression head
        metrics[2].metric("RMSE on this data", facts["RMSE on this data"])
    else:
        metrics[2].metric("Accuracy on this data",
                          facts.get("accuracy on this data", "no labels"))
    metrics[3].metric("Input shape", facts["input shape"])
    if ctx.ws.data.reshaped_from is not None:
        st.info(f"The data's samples of shape {list(ctx.ws.data.reshaped_from)} (e.g. a CSV's "
                "feature columns) were reshaped, in row-major order, to the model's input "
                f"shape {list(ctx.ws.data.inputs.shape[1:])}.", icon=":material/transform:")
    if ctx.ws.data.image_shape is not None:
        st.info("Each sample is drawn as an image of "
                f"{' × '.join(map(str, ctx.ws.data.image_shape))} (the data's image shape).",
                icon=":material/image:")
    st.markdown("**Layers that can be scored**")  # the page's width: no column clipped
    st.dataframe(layers_frame(ctx.ws.layers), hide_index=True, width="stretch",
                 column_config={"type": st.column_config.TextColumn(width="small"),
                                "neurons": st.column_config.NumberColumn(width="small")})
    st.caption(f"Model format: {facts['model format']}. A neuron is a unit of a Linear "
               "layer or a channel of a conv layer.")
    left, right = st.columns([3, 2], gap="medium")
    with left:
        st.markdown("**Cluster sizes**")
        ids, counts = np.unique(ctx.clusters, return_counts=True)
        sizes = pd.DataFrame({"cluster": [ctx.cluster_label(c) for c in ids.tolist()],
                              "samples": counts})
        st.dataframe(sizes, hide_index=True, width="stretch", column_config={
            "samples": st.column_config.ProgressColumn(
                "samples", format="%d", min_value=0, max_value=int(counts.max()))})
    if ctx.ws.class_names:
        right.caption("Classes: " + ", ".join(escape_markdown(name)
                                              for name in ctx.ws.class_names))

st.subheader("Sample files")
st.caption("Templates of every accepted layout; the demo itself is built from them.")
for index, demo_file in enumerate(at.demo_files()):
    row = st.columns([2, 5])
    row[0].download_button(demo_file.download_name, demo_file.content(),
                           file_name=demo_file.download_name, key=f"sample_{index}",
                           icon=":material/download:", on_click="ignore")
    row[1].caption(escape_markdown(demo_file.description))

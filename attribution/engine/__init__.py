"""The engine: how a model is called and split around one layer.

`guards` (eval mode, hooks only inside context managers, autograd on whatever the caller's mode),
`model_io` (tensor or named inputs, logits out of any output), `layers` (which layers exist and
which axis holds their neurons) and `runners` (the model in two parts around a layer: capture,
tail, a leaf for gradients). Imports nothing above itself.
"""

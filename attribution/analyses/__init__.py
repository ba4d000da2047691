"""Analyses built on the scores: the settings behind one view (`settings`), pruning curves
(`pruning`), exact-ablation agreement (`oracle`), the degeneracy check (`diagnose`, `verdict`),
one neuron's view (`neuron`) and scoring across processes (`distributed`).
"""

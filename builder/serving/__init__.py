"""Serving: what happens where the image runs.

``plan`` (GPU memory before boot), ``coldstart`` (how long a restart takes: image pull, weights load,
engine start), ``checkpoint`` (is the download complete and intact),
``vllm_log`` (reading vLLM's own log), ``smoke`` (boot and concurrent generation), ``kuberay``
(RayService/RayCluster manifests) and ``raycheck`` (same versions on every Ray node).
Imports ``builder.image`` and the layers below it.
"""

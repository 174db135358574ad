"""Serving: what happens where the image runs.

``plan`` (GPU memory before boot), ``coldstart`` (how long a restart takes: image pull, weights load,
engine start), ``checkpoint`` (is the download complete and intact),
``vllm_log`` (reading vLLM's own log), ``smoke`` (boot and concurrent generation), ``kuberay``
(RayService/RayCluster manifests), ``raycheck`` (same versions on every Ray node), and the cutover:
``attestation`` (the smoke verdict as an in-toto statement bound to a digest), ``history`` (a deploy tag's
promotions and rollbacks) and ``cutover`` (promote / rollback).
Imports ``builder.image`` and the layers below it.
"""

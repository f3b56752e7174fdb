"""Kubernetes I/O that the shells share: the API client, list+watch reflectors, pod Events, YAML config files
and cluster snapshot files.

Layering: `packing` (the core) <- `kubeio` <- the shells (`extender`, `nodeagent`) <- `vramfit` (the CLI).
Nothing here imports a shell; the objects it reads reach `packing` as raw API JSON.
"""

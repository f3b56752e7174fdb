"""`vramfit node`: the node agent. It closes the chain from "placed" to "running on that unit".

On each GPU node it reads the GPUs through NVML (read-only), publishes them as the node annotation
`vramfit.io/gpus`, serves the kubelet device plugin API for the resource `vramfit.io/gpu`, answers each
Allocate with exactly the units the extender booked for the pod being admitted, supervises one MPS control
daemon per MPS GPU, and compares what the kubelet handed out (pod-resources API) with what it answered.
"""

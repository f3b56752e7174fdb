"""The queue planner's shell wing: the thread that plans the pending queue (`planner`), the worker process the solve
runs in (`worker`), the worker's CPUs (`cpus`), and the verbs' one door to the plan (`verbs`). The solve and the
follow rule are the core's (packing.planning); nothing outside this folder and `extender.app` knows a plan exists."""

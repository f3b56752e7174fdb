"""The extender's verbs, one module per kube-scheduler extension point (`filter`, `prioritize`, `bind`,
`preempt`), composed by `extender.service.Extender`; `shared` holds what they share (the parsed-demand cache
and limits, the core's verdict per pod shape, the requested names' state rows)."""

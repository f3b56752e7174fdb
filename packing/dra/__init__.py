"""Dynamic Resource Allocation (`resource.k8s.io/v1`): ResourceSlices, DeviceClasses and ResourceClaims read into
the core's inventory and demands, and the allocation results vramfit writes back. Pure: JSON in, JSON out."""

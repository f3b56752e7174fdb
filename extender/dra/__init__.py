"""vramfit as the allocator of DRA ResourceClaims: the store's DRA part, the allocator loop, the API writes."""

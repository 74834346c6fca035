"""A fleet of replicas behind KV-aware routers (docs/fleet.md): ``sim`` runs N real vLLM
KVCacheManagers behind Dynamo's RadixTree and a built-in approximate router and writes the
fleet directory (``trace``: the workload; ``routers``; ``replica``: one replica's manager
and scheduling; ``plants``: the faults it can put in). Nothing here is imported by
``--help``: vLLM and Dynamo load when a run starts."""

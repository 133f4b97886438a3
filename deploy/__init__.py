"""shardport.deploy: bring a pinned, verified quantized model up on ranks and prove it runs as signed.

Consumes a registry reference (resolved once to a manifest digest), a topology (tp x ep x pp) and a
prompt. Produces the model's logits and greedy tokens, and signed evidence (parity L0-L5, dispatch,
timeline, ledgers) attached to the manifest; an HTML report on request.

- :mod:`.up` — the driver (:func:`~.up.bring_up`): resolve, contract and inventory checks, plan,
  launch, float32 reference, evidence; :mod:`.up_evidence` — L4/L5 and the predicate (pure);
- :mod:`.rank` — one rank (load, dispatch, ladder, graph, generate), a plain class; :mod:`.rank_ops`
  — its operators from the loaded tensors; :mod:`.ladder_budget` — which operators run the full parity
  ladder (``--ladder full|sample|off``); :mod:`.ray_ranks` — the thin Ray actor layer;
- :mod:`.graph` — the llama-family runtime graph; :mod:`.contract`, :mod:`.plan_layout` — what it
  needs from the manifest and the plan; :mod:`.cluster` — Ray on loopback or ``--address``;
  :mod:`.devices` — bundle, device and collective backend per rank (pure), device memory;
- :mod:`.report` — the HTML page; :mod:`.errors` — the error tree.
"""

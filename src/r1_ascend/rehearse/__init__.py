"""``r1-ascend rehearse``: the whole run on one CPU machine (launch scripts, multi-node Ray, verl's trainer loop,
checkpoint, kill, resume, report), with stand-ins only for device compute (see r1_ascend.rehearse.worker_hooks)."""

"""DMCAC: database-conditioned training (Divergence Minimisation + Cross-Attention Classification).

METHODS.md section 2. The pieces, each small and testable on its own:

- ``split``: the training query set D_Q and database set D_D;
- ``database``: the no-grad database cache Z_D in FAISS, its refresh schedule, top-k retrieval with
  self-exclusion and the union S_union of the views' neighbours (padded, with a mask);
- ``divergence``: masked softmax similarity distributions, pairwise Jensen-Shannon, L_frob;
- ``heads``: the cross-attention classifier (CAC) and the linear CE head;
- ``loss``: L = b_frob L_frob + b_ce L_ce + b_cac L_cac;
- ``views``: the A views of a query (the original + RandAugment-ed crops);
- ``sampler``: seeded epochs over D_Q;
- ``recipe``: all of it in the shared training loop (``regis train dmcac``).

Import the submodules directly; this package imports nothing heavy.
"""

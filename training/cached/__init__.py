"""The cached-feature path of the class-level recipes (issue 22): backbone tokens of a labelled set computed once
(``cache``), then a token head (``regis.models.head``) trained on them with the multi-vector triplet loss or the
DMCAC loss for thousands of steps on a CPU (``recipes``), and scored against the untrained tokens."""

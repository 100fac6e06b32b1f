"""Instance training of a token head on real photos, copy-detection style (issue 22): the edits (``edits``), the
evaluation set (``evalset``), backbone feature caches (``features``), the MaxSim InfoNCE + KoLeo loss (``loss``),
the training loop (``train``) and the evaluation (``evaluate``)."""

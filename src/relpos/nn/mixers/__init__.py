"""Token mixers other than softmax multi-head attention, each with its math beside its layer.

* ``rola``: RoLA, RoPE outside a low-rank feature map on a frequency subset of a model's
  rotary schedule (``RoLAAttention``);
* ``sparse_lowrank``: a block-sparse softmax branch plus a low-rank branch over the blocks it
  does not cover (``SparseLowRankAttention``); ``ropeslr``: RoPeSLR's absolute-position
  features for that branch;
* ``gateloop``, ``lightnet``: data-controlled decayed recurrences (``GateLoop``,
  ``LightNetAttention``, ``MDTPE``) over ``recurrence``'s shared scan;
* ``relflexformer``: linear attention modulated by an integrable function of m-D relative
  positions (``RelFlexformerAttention``), with ``nufft``'s non-uniform FFT.
"""

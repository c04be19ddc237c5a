"""Rotary (multiplicative) encodings: ``R_h(p)`` applied to q and k (and v, out).

RoPE and its variants, N-D and Lie-group rotations, and the piecewise RoPE schedules. Every
class here subclasses ``RoPE`` or declares the common RoPE options itself.
"""

"""Additive biases ``b_h(i, j)`` computed from positions alone (ALiBi, T5, KERPLE, FIRE, ...)."""

"""Harnesses that drive the channels from outside: receiver peers in their own processes, parts
that misbehave on purpose (a bad write, a corrupting or slow link, a peer that never answers) and
the channel benchmark behind `pddflow bench channels`. The tests and the benchmark use them; the
runtime never imports this package.
"""

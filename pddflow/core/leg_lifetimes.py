"""How long a leg may outlive its request: the runtime's orphan sweep and the simulator's replay
of it share these."""

# main may still extend over a turn the relay finished (its cache keeps the turn) this long
LINGER_MAX_S = 60.0
# a leg whose request ended (and that no longer lingers) this long ago, still held, is aborted
ORPHAN_GRACE_S = 5.0

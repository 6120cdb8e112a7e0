"""Capacity planning (`pddflow size`): how many replicas of each operator, within the clusters'
device counts and a budget, give the most SLA goodput (or meet a target rate cheapest), each
candidate evaluated by the simulator (docs/simulator.md, Sizing).

A candidate is a replica count per operator, for one *shape* per operator (device class and
devices per replica: the declared one, or one of the operator's `choices` in the graph; each
combination of shapes is searched on its own by `size` and the best of them wins) and, when
operators declare a host-memory KV tier (`host_cache.max_gib` > 0), one more coordinate: the rung
of the tier's size ladder (`host_tier.ladder`: 0 and doublings up to max_gib, every tiered
operator on the same rung), priced per replica.

- `space.py`: the candidates a plan may take, their cost, and the plan each one stands for;
- `workloads.py`: the workload sources, one workload at any offered rate;
- `scores.py`: one candidate's score, from replays of the simulator;
- `cache.py`: scores cached across runs, keyed by everything they depend on;
- `search.py`: which candidates to score, and the winner.
"""

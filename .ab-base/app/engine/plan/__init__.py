"""The memory plan: a model's shape (`shape.py`, through the families' own parsers), the one memory
model (`memory.py`), will-it-fit for `paddock fit` and the Studio (`fit.py`, with `vision_fit.py` and
`expert_plan.py`), and the engine's resolved choices (`engine_plan.py`: `resolve -> EnginePlan`;
`tiers.py` builds its offload tiers)."""

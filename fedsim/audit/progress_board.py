"""The audit's progress board: a Ray actor (no CPU) that attack tasks post their steps to.

In a module of its own, importing nothing: the actor's process imports only this
(about 0.5 s), not the attacks and torch that :mod:`fedsim.audit.tasks` brings (4 s).
"""

from __future__ import annotations


class ProgressBoard:
    """Progress posts from attack tasks, collected for the driver."""

    def __init__(self) -> None:
        self._posts: list[tuple[str, int, int, float]] = []

    def post(self, key: str, step: int, total: int, best: float) -> None:
        self._posts.append((key, step, total, best))

    def take(self) -> list[tuple[str, int, int, float]]:
        posts, self._posts = self._posts, []
        return posts

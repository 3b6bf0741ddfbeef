"""A synthetic set task whose needed attention rank is a knob: the projected farthest point.

Each example is a set of N points uniform on the unit sphere in R^d. A projection U ∈ R^{r×d} with
orthonormal rows (one per task instance) gives point i the target

    j*(i) = argmin_j ⟨U x_i, U x_j⟩,        target_i = x_{j*(i)}.

The score a head needs has rank r and a head's logits rank ≤ d_p (paper Section 3), so d_p ≥ r suffices and
d_p < r misses some queries. r = d is the farthest-point task of Amsel, Yehudai and Bruna (arXiv 2407.16153).
Unit-norm points make predicting zero score exactly 1 in MSE × d; orthonormal rows weigh U's directions
equally. Points [batch, N, d], targets [batch, N, d], indices [batch, N].
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def sample_sphere(
    shape: tuple[int, ...], dim: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Points drawn uniformly from the unit sphere S^{dim−1}: a tensor [*shape, dim] of unit rows."""
    x = torch.randn(*shape, dim, generator=generator, dtype=dtype)
    return x / x.norm(dim=-1, keepdim=True)


def orthonormal_projection(rank: int, dim: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """U ∈ R^{rank×dim} with orthonormal rows: the first rows of a Haar-random rotation (QR of a Gaussian with
    R's diagonal signs folded in, Mezzadri 2007). Each ``(rank, dim, seed)`` is its own instance."""
    rank, dim = _positive_int("rank", rank), _positive_int("dim", dim)
    if rank > dim:
        raise ValueError(f"rank must be at most dim, got rank={rank} > dim={dim}")
    g = torch.Generator().manual_seed(int(seed))
    a = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r))  # column j times sign(R_jj): Haar-distributed rotation
    return q.T[:rank].contiguous().to(dtype)


def farthest_point_indices(points: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """j*(i) = argmin_j ⟨U x_i, U x_j⟩: points [batch, N, d], U [r, d] -> int64 [batch, N]."""
    if points.dim() != 3:
        raise ValueError(f"points must be [batch, N, d], got shape {tuple(points.shape)}")
    if projection.dim() != 2 or projection.shape[1] != points.shape[-1]:
        raise ValueError(
            f"projection must be [r, {points.shape[-1]}] (d of the points), got shape {tuple(projection.shape)}"
        )
    z = points @ projection.to(points.dtype).T  # [batch, N, r]: U x_j
    scores = z @ z.transpose(1, 2)  # [batch, N, N]: ⟨U x_i, U x_j⟩
    return scores.argmin(dim=-1)


def gather_points(points: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """points[b, index[b, i]] for every b, i: [batch, N, d] from [batch, N, d] and [batch, N]."""
    return torch.gather(points, 1, index.unsqueeze(-1).expand(-1, -1, points.shape[-1]))


@dataclass(frozen=True)
class FarthestPointTask:
    """One task instance: sets of N = ``num_points`` unit vectors in R^``dim`` and the target of rank ``rank`` ≤ dim
    (``seed`` fixes U; samples take their own generator)."""

    dim: int
    rank: int
    num_points: int = 16
    seed: int = 0

    def __post_init__(self):
        _positive_int("dim", self.dim)
        _positive_int("rank", self.rank)
        _positive_int("num_points", self.num_points)
        if self.rank > self.dim:
            raise ValueError(f"rank must be at most dim, got rank={self.rank} > dim={self.dim}")
        if self.num_points < 2:
            raise ValueError(f"num_points must be at least 2, got {self.num_points}")

    @property
    def projection(self) -> torch.Tensor:
        """U, [rank, dim], orthonormal rows (see :func:`orthonormal_projection`)."""
        return orthonormal_projection(self.rank, self.dim, self.seed)

    def sample(
        self, batch_size: int, generator: torch.Generator | None = None, projection: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draw ``batch_size`` sets: (points [batch, N, d], targets [batch, N, d], indices [batch, N]).
        ``projection``: U if already computed (saves a QR per call)."""
        batch_size = _positive_int("batch_size", batch_size)
        u = self.projection if projection is None else projection
        x = sample_sphere((batch_size, self.num_points), self.dim, generator)
        idx = farthest_point_indices(x, u)
        return x, gather_points(x, idx), idx

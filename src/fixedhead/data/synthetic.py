"""A synthetic set task whose needed attention rank is a knob: the projected farthest point.

Each example is a set of N points uniform on the unit sphere in R^d (no positions). A projection U ∈ R^{r×d}
with orthonormal rows (one per task instance, from a seed) gives each point i its target

    j*(i) = argmin_j ⟨U x_i, U x_j⟩,        target_i = x_{j*(i)}.

The score a head needs, −x_iᵀ UᵀU x_j, has rank r, and a head's logits have rank ≤ d_p (paper Section 3): a
head with d_p ≥ r can attend to j*(i), one with d_p < r picks another point for some queries. With r = d this
is the farthest-point task of Amsel, Yehudai and Bruna (arXiv 2407.16153). Unit-norm points make predicting
zero score exactly 1 in MSE × d; orthonormal rows weigh each of U's r directions the same (a Gaussian U would
blur the threshold below r). The point itself wins with probability below 2^{−(N−1)}, so no diagonal mask.

Tensors are batch-first: points [batch, N, d], targets [batch, N, d], indices [batch, N].
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
    """U ∈ R^{rank×dim} with orthonormal rows: the first ``rank`` rows of a Haar-random rotation.

    Haar measure via the QR decomposition of a Gaussian matrix with the signs of R's diagonal
    folded into Q (Mezzadri 2007). The same ``(rank, dim, seed)`` always gives the same U, and the
    U of a smaller rank is *not* a sub-matrix of a larger one's (each rank is its own instance).

    Raises:
        ValueError: rank or dim not a positive int, or rank > dim.
    """
    rank, dim = _positive_int("rank", rank), _positive_int("dim", dim)
    if rank > dim:
        raise ValueError(f"rank must be at most dim, got rank={rank} > dim={dim}")
    g = torch.Generator().manual_seed(int(seed))
    a = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r))  # column j times sign(R_jj): Haar-distributed rotation
    return q.T[:rank].contiguous().to(dtype)


def farthest_point_indices(points: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """j*(i) = argmin_j ⟨U x_i, U x_j⟩ for every point of every set.

    Args:
        points: [batch, N, d].
        projection: U, [r, d].

    Returns:
        [batch, N] int64 indices into the N points.

    Raises:
        ValueError: shapes that do not fit ([batch, N, d] points and [r, d] with the same d).
    """
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
    """One task instance: sets of ``num_points`` unit vectors in R^``dim`` and the rank-``rank`` target.

    Args:
        dim: d, the dimension of the points (and the model's hidden size).
        rank: r ≤ d, the rank of the bilinear form UᵀU the target needs.
        num_points: N, points per set (≥ 2).
        seed: the seed of U (the task instance); samples take their own generator.

    Raises:
        ValueError: a size that is not a positive int, rank > dim, or num_points < 2.
    """

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
        """Draw ``batch_size`` fresh sets.

        Args:
            batch_size: number of sets.
            generator: the random source of the points (None: torch's global one).
            projection: U if already computed (saves a QR per call); None computes it.

        Returns:
            (points [batch, N, d], targets [batch, N, d] = x_{j*(i)}, indices [batch, N] = j*(i)).

        Raises:
            ValueError: batch_size not a positive int.
        """
        batch_size = _positive_int("batch_size", batch_size)
        u = self.projection if projection is None else projection
        x = sample_sphere((batch_size, self.num_points), self.dim, generator)
        idx = farthest_point_indices(x, u)
        return x, gather_points(x, idx), idx

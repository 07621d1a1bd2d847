//! The arithmetic of an N-D device mesh with named axes.
//!
//! Ranks are laid out row-major: the last axis varies fastest, so it is the
//! innermost (put the axis that talks most, tensor parallelism, last; with
//! a topology-aware rank order it then stays inside one NVLink island).
//! A communicator along some axes joins the ranks that agree on every other
//! axis: [`MeshShape::split_for`] gives the `ncclCommSplit` color and key.

use std::fmt;

/// A mesh shape that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MeshError {
    /// The product of the axis sizes is not the world size.
    #[error("mesh shape {shape} has {product} ranks, the world has {world}")]
    ShapeMismatch {
        /// The shape, as text.
        shape: String,
        /// Product of the sizes.
        product: usize,
        /// World size.
        world: usize,
    },
    /// The product of the axis sizes does not fit in a `usize`.
    #[error("mesh shape {shape} has more ranks than a usize can count")]
    Overflow {
        /// The shape, as text.
        shape: String,
    },
    /// No axis of that name.
    #[error("no mesh axis named {0:?}")]
    UnknownAxis(String),
    /// Two axes share a name (or an axis is named twice in a request).
    #[error("mesh axis {0:?} appears twice")]
    DuplicateAxis(String),
    /// An axis without a name, or a mesh without axes.
    #[error("mesh axes need non-empty names, and a mesh at least one axis")]
    Empty,
    /// An axis of size 0.
    #[error("mesh axis {0:?} has size 0")]
    ZeroSize(String),
    /// Axes to flatten must be adjacent and in mesh order.
    #[error("axes {0:?} are not adjacent in mesh order")]
    NotContiguous(Vec<String>),
    /// Every index of the replica axis lost a rank: no replica is left.
    #[error("every replica along mesh axis {0:?} lost a rank")]
    NoReplicaLeft(String),
    /// A rank outside the mesh.
    #[error("rank {rank} is outside a mesh of {size} ranks")]
    RankOutOfRange {
        /// The rank.
        rank: usize,
        /// The mesh size.
        size: usize,
    },
}

/// Named axes and their sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshShape {
    axes: Vec<(String, usize)>,
}

impl fmt::Display for MeshShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.axes.iter().map(|(n, s)| format!("{n}={s}")).collect();
        write!(f, "({})", parts.join(", "))
    }
}

impl MeshShape {
    /// Checks names and sizes and that the sizes multiply to `world`
    /// ([`MeshError::Overflow`] when their product does not fit in a
    /// `usize`).
    pub fn new(axes: &[(&str, usize)], world: usize) -> Result<MeshShape, MeshError> {
        let shape = MeshShape::unchecked(axes)?;
        let product = shape.size();
        if product != world {
            return Err(MeshError::ShapeMismatch {
                shape: shape.to_string(),
                product,
                world,
            });
        }
        Ok(shape)
    }

    fn unchecked(axes: &[(&str, usize)]) -> Result<MeshShape, MeshError> {
        if axes.is_empty() || axes.iter().any(|(n, _)| n.is_empty()) {
            return Err(MeshError::Empty);
        }
        for (i, (name, size)) in axes.iter().enumerate() {
            if axes[..i].iter().any(|(n, _)| n == name) {
                return Err(MeshError::DuplicateAxis(name.to_string()));
            }
            if *size == 0 {
                return Err(MeshError::ZeroSize(name.to_string()));
            }
        }
        let shape = MeshShape {
            axes: axes.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
        };
        // Checked once here, so `size` and the arithmetic of every shape
        // made from this one (slices and flattenings multiply subsets of
        // these sizes) cannot overflow.
        let product = axes
            .iter()
            .try_fold(1usize, |product, (_, size)| product.checked_mul(*size));
        if product.is_none() {
            return Err(MeshError::Overflow {
                shape: shape.to_string(),
            });
        }
        Ok(shape)
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.axes.iter().map(|(_, s)| s).product()
    }

    /// The axes with their sizes, outermost first (what
    /// [`crate::DeviceMesh::new`] takes).
    pub fn axes(&self) -> Vec<(&str, usize)> {
        self.axes.iter().map(|(n, s)| (n.as_str(), *s)).collect()
    }

    /// Axis names, outermost first.
    pub fn names(&self) -> Vec<&str> {
        self.axes.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// Size of one axis.
    pub fn axis_size(&self, axis: &str) -> Result<usize, MeshError> {
        Ok(self.axes[self.index(axis)?].1)
    }

    fn index(&self, axis: &str) -> Result<usize, MeshError> {
        self.axes
            .iter()
            .position(|(n, _)| n == axis)
            .ok_or_else(|| MeshError::UnknownAxis(axis.to_string()))
    }

    fn indices(&self, axes: &[&str]) -> Result<Vec<usize>, MeshError> {
        let mut out = Vec::with_capacity(axes.len());
        for (i, a) in axes.iter().enumerate() {
            if axes[..i].contains(a) {
                return Err(MeshError::DuplicateAxis(a.to_string()));
            }
            out.push(self.index(a)?);
        }
        if out.is_empty() {
            return Err(MeshError::Empty);
        }
        Ok(out)
    }

    /// The coordinate of `rank`, one entry per axis.
    pub fn coordinate(&self, rank: usize) -> Result<Vec<usize>, MeshError> {
        if rank >= self.size() {
            return Err(MeshError::RankOutOfRange {
                rank,
                size: self.size(),
            });
        }
        let mut rest = rank;
        let mut coord = vec![0; self.axes.len()];
        for (i, (_, size)) in self.axes.iter().enumerate().rev() {
            coord[i] = rest % size;
            rest /= size;
        }
        Ok(coord)
    }

    /// The rank at `coord` (one entry per axis, each in range).
    pub fn rank_of(&self, coord: &[usize]) -> Option<usize> {
        if coord.len() != self.axes.len() {
            return None;
        }
        let mut rank = 0;
        for (c, (_, size)) in coord.iter().zip(&self.axes) {
            if c >= size {
                return None;
            }
            rank = rank * size + c;
        }
        Some(rank)
    }

    /// `(color, key)` for `ncclCommSplit` so that `rank` joins the ranks
    /// that share its coordinates on every axis not in `axes`; `key` orders
    /// them by their coordinates on `axes` (in the order given).
    pub fn split_for(&self, rank: usize, axes: &[&str]) -> Result<(u32, i32), MeshError> {
        let coord = self.coordinate(rank)?;
        let inside = self.indices(axes)?;
        let mut color = 0usize;
        for (i, (_, size)) in self.axes.iter().enumerate() {
            if !inside.contains(&i) {
                color = color * size + coord[i];
            }
        }
        let mut key = 0usize;
        for &i in &inside {
            key = key * self.axes[i].1 + coord[i];
        }
        Ok((color as u32, key as i32))
    }

    /// The ranks in `rank`'s group along `axes`, ordered by key.
    pub fn group_members(&self, rank: usize, axes: &[&str]) -> Result<Vec<usize>, MeshError> {
        let (color, _) = self.split_for(rank, axes)?;
        let mut members: Vec<(i32, usize)> = (0..self.size())
            .filter_map(|r| {
                self.split_for(r, axes)
                    .ok()
                    .filter(|(c, _)| *c == color)
                    .map(|(_, k)| (k, r))
            })
            .collect();
        members.sort_unstable();
        Ok(members.into_iter().map(|(_, r)| r).collect())
    }

    /// The sub-shape made of `axes`, in the order given.
    pub fn slice(&self, axes: &[&str]) -> Result<MeshShape, MeshError> {
        let idx = self.indices(axes)?;
        Ok(MeshShape {
            axes: idx.into_iter().map(|i| self.axes[i].clone()).collect(),
        })
    }

    /// The recovery policy for a mesh that lost the positions `lost`:
    /// every index of `axis` (the replica axis, data parallelism) whose
    /// slice holds a lost position is dropped whole, so the replicas left
    /// keep every other axis (their tensor- and pipeline-parallel groups)
    /// intact and the model's sharding does not change. Gives the smaller
    /// shape and the old positions that keep a place, in the new shape's
    /// row-major order. A (dp=2, tp=2) mesh that lost position 3 becomes
    /// (dp=1, tp=2) of positions 0 and 1.
    ///
    /// [`MeshError::NoReplicaLeft`] when every replica lost a position;
    /// an unknown axis or a position outside the mesh is its own error.
    pub fn without_replicas(
        &self,
        axis: &str,
        lost: &[usize],
    ) -> Result<(MeshShape, Vec<usize>), MeshError> {
        let i = self.index(axis)?;
        let size = self.size();
        let mut dropped = vec![false; self.axes[i].1];
        for &p in lost {
            dropped[self.coordinate(p)?[i]] = true;
        }
        let left = dropped.iter().filter(|d| !**d).count();
        if left == 0 {
            return Err(MeshError::NoReplicaLeft(axis.to_string()));
        }
        let mut axes = self.axes.clone();
        axes[i].1 = left;
        let mut keep = Vec::with_capacity(size / self.axes[i].1 * left);
        for p in 0..size {
            if !dropped[self.coordinate(p)?[i]] {
                keep.push(p);
            }
        }
        Ok((MeshShape { axes }, keep))
    }

    /// The shape with the adjacent `axes` (in mesh order) merged into one
    /// axis called `name`.
    pub fn flatten(&self, axes: &[&str], name: &str) -> Result<MeshShape, MeshError> {
        let idx = self.indices(axes)?;
        if idx.windows(2).any(|w| w[1] != w[0] + 1) {
            return Err(MeshError::NotContiguous(
                axes.iter().map(|a| a.to_string()).collect(),
            ));
        }
        if name.is_empty() {
            return Err(MeshError::Empty);
        }
        let (first, last) = (idx[0], idx[idx.len() - 1]);
        if self
            .axes
            .iter()
            .enumerate()
            .any(|(i, (n, _))| (i < first || i > last) && n == name)
        {
            return Err(MeshError::DuplicateAxis(name.to_string()));
        }
        let merged: usize = idx.iter().map(|&i| self.axes[i].1).product();
        let mut axes: Vec<(String, usize)> = self.axes[..first].to_vec();
        axes.push((name.to_string(), merged));
        axes.extend_from_slice(&self.axes[last + 1..]);
        Ok(MeshShape { axes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_must_multiply_to_the_world_with_unique_named_axes() {
        assert!(MeshShape::new(&[("dp", 2), ("tp", 2)], 4).is_ok());
        assert_eq!(
            MeshShape::new(&[("dp", 2), ("tp", 3)], 4).unwrap_err(),
            MeshError::ShapeMismatch {
                shape: "(dp=2, tp=3)".into(),
                product: 6,
                world: 4
            }
        );
        assert_eq!(
            MeshShape::new(&[("dp", 2), ("dp", 2)], 4).unwrap_err(),
            MeshError::DuplicateAxis("dp".into())
        );
        assert_eq!(MeshShape::new(&[], 1).unwrap_err(), MeshError::Empty);
        assert_eq!(MeshShape::new(&[("", 1)], 1).unwrap_err(), MeshError::Empty);
        assert_eq!(
            MeshShape::new(&[("x", 0)], 0).unwrap_err(),
            MeshError::ZeroSize("x".into())
        );
    }

    #[test]
    fn a_shape_whose_product_overflows_is_refused_naming_it() {
        let half = usize::MAX / 2 + 1;
        // 2^63 * 2 wrapped to 0 in release builds (and panicked in debug).
        assert_eq!(
            MeshShape::new(&[("dp", half), ("tp", 2)], 0).unwrap_err(),
            MeshError::Overflow {
                shape: format!("(dp={half}, tp=2)"),
            }
        );
        // (2^63 + 1) * 2 wrapped to 2: a world of 2 used to accept it.
        assert_eq!(
            MeshShape::new(&[("a", half + 1), ("b", 2)], 2).unwrap_err(),
            MeshError::Overflow {
                shape: format!("(a={}, b=2)", half + 1),
            }
        );
        // Only the last factor overflows: the first two multiply fine.
        let quarter = 1usize << (usize::BITS / 4);
        let err = MeshShape::new(&[("pp", quarter), ("dp", quarter), ("tp", half)], 4).unwrap_err();
        assert_eq!(
            err,
            MeshError::Overflow {
                shape: format!("(pp={quarter}, dp={quarter}, tp={half})"),
            }
        );
        assert!(err.to_string().contains("tp="), "{err}");
        // The largest product that fits is still a shape.
        let fits = MeshShape::new(&[("a", usize::MAX / 3), ("b", 3)], usize::MAX / 3 * 3).unwrap();
        assert_eq!(fits.size(), usize::MAX / 3 * 3);
    }

    #[test]
    fn a_2x2_mesh_splits_into_rows_and_columns() {
        let m = MeshShape::new(&[("dp", 2), ("tp", 2)], 4).unwrap();
        assert_eq!(m.coordinate(3).unwrap(), vec![1, 1]);
        assert_eq!(m.coordinate(1).unwrap(), vec![0, 1]);
        // tp groups are the rows {0,1}, {2,3}; dp groups the columns.
        assert_eq!(m.group_members(0, &["tp"]).unwrap(), vec![0, 1]);
        assert_eq!(m.group_members(3, &["tp"]).unwrap(), vec![2, 3]);
        assert_eq!(m.group_members(1, &["dp"]).unwrap(), vec![1, 3]);
        assert_eq!(m.split_for(2, &["dp"]).unwrap(), (0, 1));
        assert_eq!(m.split_for(2, &["tp"]).unwrap(), (1, 0));
        // Both axes: everyone, keyed by rank.
        assert_eq!(m.group_members(2, &["dp", "tp"]).unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(m.split_for(2, &["dp", "tp"]).unwrap(), (0, 2));
        assert_eq!(
            m.split_for(0, &["pp"]).unwrap_err(),
            MeshError::UnknownAxis("pp".into())
        );
        assert_eq!(
            m.coordinate(4).unwrap_err(),
            MeshError::RankOutOfRange { rank: 4, size: 4 }
        );
    }

    /// Every split of every axis subset partitions the ranks into groups of
    /// the right size with keys 0..size, for shapes up to 4-D.
    #[test]
    fn splits_partition_the_mesh_for_shapes_up_to_4d() {
        let shapes: &[&[(&str, usize)]] = &[
            &[("a", 8)],
            &[("a", 2), ("b", 4)],
            &[("a", 3), ("b", 1), ("c", 2)],
            &[("a", 2), ("b", 3), ("c", 2), ("d", 2)],
        ];
        for axes in shapes {
            let world: usize = axes.iter().map(|(_, s)| s).product();
            let m = MeshShape::new(axes, world).unwrap();
            for r in 0..world {
                assert_eq!(m.rank_of(&m.coordinate(r).unwrap()), Some(r));
            }
            let names = m.names();
            for mask in 1u32..(1 << names.len()) {
                let chosen: Vec<&str> = names
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, n)| *n)
                    .collect();
                let group_size: usize = chosen.iter().map(|a| m.axis_size(a).unwrap()).product();
                for r in 0..world {
                    let members = m.group_members(r, &chosen).unwrap();
                    assert_eq!(members.len(), group_size, "{m} {chosen:?}");
                    assert!(members.contains(&r));
                    let keys: Vec<i32> = members
                        .iter()
                        .map(|x| m.split_for(*x, &chosen).unwrap().1)
                        .collect();
                    assert_eq!(
                        keys,
                        (0..group_size as i32).collect::<Vec<_>>(),
                        "{m} {chosen:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_replica_that_lost_a_rank_is_dropped_whole() {
        let m = MeshShape::new(&[("dp", 2), ("tp", 2)], 4).unwrap();
        let (shape, keep) = m.without_replicas("dp", &[3]).unwrap();
        assert_eq!(shape.to_string(), "(dp=1, tp=2)");
        assert_eq!(keep, vec![0, 1]);
        // The replica axis need not come first; two losses in one replica
        // drop it once; the kept positions stay in row-major order.
        let m = MeshShape::new(&[("tp", 2), ("dp", 3)], 6).unwrap();
        let (shape, keep) = m.without_replicas("dp", &[1, 4]).unwrap();
        assert_eq!(shape.to_string(), "(tp=2, dp=2)");
        assert_eq!(keep, vec![0, 2, 3, 5]);
        assert_eq!(
            MeshShape::new(&[("dp", 2), ("tp", 2)], 4)
                .unwrap()
                .without_replicas("dp", &[0, 3])
                .unwrap_err(),
            MeshError::NoReplicaLeft("dp".into())
        );
        assert!(matches!(
            m.without_replicas("pp", &[0]).unwrap_err(),
            MeshError::UnknownAxis(_)
        ));
        assert!(matches!(
            m.without_replicas("dp", &[6]).unwrap_err(),
            MeshError::RankOutOfRange { .. }
        ));
    }

    #[test]
    fn slice_and_flatten() {
        let m = MeshShape::new(&[("pp", 2), ("dp", 3), ("tp", 4)], 24).unwrap();
        assert_eq!(m.slice(&["tp", "dp"]).unwrap().to_string(), "(tp=4, dp=3)");
        let f = m.flatten(&["dp", "tp"], "dp_tp").unwrap();
        assert_eq!(f.to_string(), "(pp=2, dp_tp=12)");
        // Flattening keeps the rank order: same groups as the two axes.
        for r in 0..24 {
            assert_eq!(
                f.group_members(r, &["dp_tp"]).unwrap(),
                m.group_members(r, &["dp", "tp"]).unwrap()
            );
        }
        assert!(matches!(
            m.flatten(&["pp", "tp"], "x").unwrap_err(),
            MeshError::NotContiguous(_)
        ));
        assert_eq!(
            m.flatten(&["dp", "tp"], "pp").unwrap_err(),
            MeshError::DuplicateAxis("pp".into())
        );
        assert_eq!(
            m.slice(&["dp", "dp"]).unwrap_err(),
            MeshError::DuplicateAxis("dp".into())
        );
    }
}

//! [`DeviceMesh`]: the world laid out on named axes, with a communicator
//! per axis.
//!
//! A mesh `[("dp", 2), ("tp", 2)]` over four ranks puts them on a 2×2
//! grid, row-major (the last axis varies fastest). The `"tp"` communicator
//! of a rank joins the ranks on its row, the `"dp"` one those on its
//! column; both come from `ncclCommSplit` on the world communicator. The
//! whole mesh in the world's rank order is the world's communicator,
//! shared ([`nccl_safe::Comm::share`]), and an axis that holds every rank
//! (the others have size 1, as `tp` in `[("dp", 1), ("tp", 4)]`) is the
//! whole mesh's: no split, and no second set of connections for NCCL to
//! make (the world made them when it was created, unless
//! [`crate::WorldOptions::lazy_connect`]).
//!
//! ```no_run
//! use nccl_dist::{DeviceMesh, World};
//! use nccl_dist::nccl_safe::ReduceOp;
//!
//! let world = World::init()?;
//! let mesh = DeviceMesh::new(&world, &[("dp", 2), ("tp", 2)])?;
//! let stream = mesh.axis("tp")?.stream().clone();
//! let mut activations = stream.clone_htod(&[1.0f32; 1024])?;
//! mesh.all_reduce_in_place("tp", &mut activations, ReduceOp::Sum)?;
//! mesh.all_reduce_in_place("dp", &mut activations, ReduceOp::Avg)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::mem::ManuallyDrop;
use std::sync::Weak;

use nccl_safe::{Comm, Config};

use crate::error::{Error, Result};
use crate::mesh::{MeshError, MeshShape};
use crate::placement::{Placement, nvlink_ranks, ranks_on_one_host};
use crate::watchdog::{inherit, inherit_ranks};
use crate::world::{Keeper, World};

/// [`DeviceMesh::from_world`]'s error, with the world it was given
/// ([`FromWorldError::into_world`]). `Send` and `Sync`, as boxed errors
/// want, though a `World` is not `Sync`.
#[derive(Debug)]
pub struct FromWorldError {
    /// What went wrong (a bad shape before anything happened, or a split
    /// that failed).
    pub error: Error,
    world: Box<std::sync::Mutex<World>>,
}

impl FromWorldError {
    /// The world, as it was left: usable after a bad shape; after a
    /// failed split, as its error says (a lost peer aborts it).
    pub fn into_world(self) -> World {
        (*self.world)
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Display for FromWorldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceMesh::from_world: {}", self.error)
    }
}

impl std::error::Error for FromWorldError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<FromWorldError> for Error {
    /// The error alone (the world is dropped).
    fn from(e: FromWorldError) -> Error {
        e.error
    }
}

/// A communicator over some axes of the mesh, under a name.
#[derive(Debug)]
struct Group {
    name: String,
    axes: Vec<String>,
    /// `None`: the group holds every rank of the mesh in its order (an
    /// axis all others of which have size 1), so it is the whole mesh's
    /// communicator: no second split, and no second set of connections
    /// for NCCL to make at its first call.
    comm: Option<Comm>,
}

/// The world on named axes, with one communicator per axis (and per
/// flattened group).
#[derive(Debug)]
pub struct DeviceMesh {
    shape: MeshShape,
    position: usize,
    ranks: Vec<usize>,
    /// Taken only by the drop (which drops every communicator together).
    /// `None`: the whole mesh is the world's own communicator, in rank
    /// order ([`DeviceMesh::from_world`]; `world` is then `Some`). In rank
    /// order otherwise, a handle shared with the world's
    /// ([`Comm::share`]).
    whole: ManuallyDrop<Option<Comm>>,
    groups: Vec<Group>,
    /// The world, for a mesh that owns it ([`DeviceMesh::from_world`]).
    /// Dropped after the mesh's own communicators.
    world: Option<World>,
    /// Where the world keeps this mesh's own communicators past a loss
    /// (`world/on_loss.rs`), and the configuration a flattened group is
    /// split with (the world's for its children: they park with it).
    keeper: Weak<Keeper>,
    child_config: Option<Config>,
}

impl Drop for DeviceMesh {
    /// Drops the mesh's communicators with their teardowns running at
    /// the same time ([`nccl_safe::drop_together`]), bounded by their
    /// timeout.
    fn drop(&mut self) {
        let groups = std::mem::take(&mut self.groups);
        // SAFETY: `whole` is taken once, here, and not used afterwards.
        let whole = unsafe { ManuallyDrop::take(&mut self.whole) };
        nccl_safe::drop_together(
            whole
                .into_iter()
                .chain(groups.into_iter().filter_map(|g| g.comm)),
        );
    }
}

/// Has the world keep `comm` (a mesh's own) past a loss, where it keeps
/// its meshes' (see `world/on_loss.rs`).
fn watch(keeper: &Weak<Keeper>, comm: &Comm) {
    if let Some(k) = keeper.upgrade() {
        k.watch(comm);
    }
}

/// Whether the mesh's positions hold the world's ranks in the world's
/// order: its whole communicator is then the world's, shared.
fn in_world_order(ranks: &[usize]) -> bool {
    ranks.iter().enumerate().all(|(i, &r)| i == r)
}

/// The most channels (CTAs) of a mesh's one-rank communicators. NCCL
/// runs a one-rank collective as a local copy or reduction that uses no
/// channel, yet sets every channel up at init: 64 on H100s with NCCL
/// 2.28.3, most of a one-rank split's 30–80 ms (`NCCL_DEBUG=INFO`'s init
/// timings: "connections"). A send to oneself still runs on them, so a
/// few stay.
pub(crate) const ONE_RANK_MAX_CTAS: i32 = 4;

/// `config` for a one-rank communicator: its channels bounded by
/// [`ONE_RANK_MAX_CTAS`], unless the configuration bounds them itself
/// (its `minCTAs` or `maxCTAs` stand).
fn one_rank(config: &Config) -> Config {
    let config = config.clone();
    if config.get_max_ctas().is_some() || config.get_min_ctas().is_some() {
        return config;
    }
    config.max_ctas(ONE_RANK_MAX_CTAS)
}

/// Returns the split (color, key) of every position for `axes`.
fn splits(
    shape: &MeshShape,
    positions: &[usize],
    axes: &[&str],
) -> Result<(Vec<Option<u32>>, Vec<i32>)> {
    let mut colors = Vec::with_capacity(positions.len());
    let mut keys = Vec::with_capacity(positions.len());
    for &p in positions {
        let (c, k) = shape.split_for(p, axes)?;
        colors.push(Some(c));
        keys.push(k);
    }
    Ok((colors, keys))
}

/// Whether `axis` holds every rank of the mesh (every other axis has
/// size 1): its communicator is then the whole mesh's, in the same order
/// (the position along it is the mesh position).
fn spans_the_mesh(shape: &MeshShape, axis: &str) -> Result<bool> {
    Ok(shape.axis_size(axis)? == shape.size())
}

fn split_missing() -> Error {
    Error::InvalidArgument {
        op: "DeviceMesh",
        reason: "ncclCommSplit gave no communicator for a rank with a color".into(),
    }
}

impl DeviceMesh {
    /// The mesh over `world` in rank order: every rank calls this with the
    /// same axes. The whole mesh shares the world's communicator
    /// ([`Comm::share`]: its connections, its watch); each axis that does
    /// not hold every rank is one `ncclCommSplit`, collective (a mesh
    /// whose every axis holds every rank makes none, and its first
    /// collective is where a lost peer shows). Calls through such axes and
    /// through the world are calls on one communicator: every rank must
    /// make them in the same order, as NCCL requires.
    pub fn new(world: &World, axes: &[(&str, usize)]) -> Result<DeviceMesh> {
        DeviceMesh::new_with(world, axes, Placement::RankOrder)
    }

    /// As [`DeviceMesh::new`], with the placement chosen.
    pub fn new_with(
        world: &World,
        axes: &[(&str, usize)],
        placement: Placement,
    ) -> Result<DeviceMesh> {
        DeviceMesh::build(world, axes, placement, false)
    }

    /// The mesh over `world` in rank order, keeping the world: the whole
    /// mesh is then the world's own communicator (no split), and so is
    /// every axis that holds every rank (as `dp` of `[("dp", n)]` or `tp`
    /// of `[("dp", 1), ("tp", n)]`). NCCL connects a communicator's ranks
    /// lazily at its first call (136–149 ms between two processes on 2
    /// H200s, NCCL 2.28), once per communicator: such an axis shares the
    /// world's connections instead of making its own. Collective, as
    /// [`DeviceMesh::new`], for a thread or a process per rank (one thread
    /// driving several worlds makes their meshes together with
    /// [`DeviceMesh::new_all`]); [`DeviceMesh::world`] and
    /// [`DeviceMesh::into_world`] give the world back.
    ///
    /// ```no_run
    /// use nccl_dist::{DeviceMesh, World};
    /// use nccl_dist::nccl_safe::ReduceOp;
    ///
    /// let world = World::init()?;
    /// let n = world.size();
    /// let mesh = DeviceMesh::from_world(world, &[("dp", 1), ("tp", n)])?;
    /// let tp = mesh.axis("tp")?; // the world's own communicator
    /// let mut x = tp.stream().clone_htod(&[1.0f32; 1024])?;
    /// mesh.all_reduce_in_place("tp", &mut x, ReduceOp::Sum)?;
    /// let world = mesh.into_world();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// An error gives the world back with it ([`FromWorldError`]; `?`
    /// into this crate's [`Error`] drops the world).
    pub fn from_world(
        world: World,
        axes: &[(&str, usize)],
    ) -> std::result::Result<DeviceMesh, FromWorldError> {
        let built = if world.driven_with_others() {
            Err(Error::InvalidArgument {
                op: "DeviceMesh::from_world",
                reason: "one thread drives this world's ranks (World::local): make their meshes together with DeviceMesh::new_all".into(),
            })
        } else {
            DeviceMesh::build(&world, axes, Placement::RankOrder, true)
        };
        match built {
            Ok(mut mesh) => {
                mesh.world = Some(world);
                Ok(mesh)
            }
            Err(error) => Err(FromWorldError {
                error,
                world: Box::new(std::sync::Mutex::new(world)),
            }),
        }
    }

    /// The world of a mesh made by [`DeviceMesh::from_world`].
    pub fn world(&self) -> Option<&World> {
        self.world.as_ref()
    }

    /// The world of a mesh made by [`DeviceMesh::from_world`], after the
    /// mesh's own communicators are dropped (as the mesh's drop does).
    pub fn into_world(mut self) -> Option<World> {
        let world = self.world.take();
        // The drop leaves the world's communicator alone: the groups that
        // are it hold no communicator of their own.
        drop(self);
        world
    }

    /// The mesh over `world`; `reuse`: its whole communicator is the
    /// world's own (rank order only), for [`DeviceMesh::from_world`],
    /// which then hands the world to the mesh.
    fn build(
        world: &World,
        axes: &[(&str, usize)],
        placement: Placement,
        reuse: bool,
    ) -> Result<DeviceMesh> {
        let shape = MeshShape::new(axes, world.size())?;
        let _span = tracing::debug_span!("nccl.device_mesh", %shape, rank = world.rank()).entered();
        let ranks = match placement {
            Placement::RankOrder => (0..world.size()).collect(),
            Placement::NvlinkIslands => nvlink_ranks(world.comm())?,
        };
        let position = ranks
            .iter()
            .position(|&r| r == world.rank())
            .ok_or_else(split_missing)?;
        // Every communicator of the mesh is split from the world's
        // nonblocking parent (where it has one), so a peer lost mid-split
        // aborts the split instead of hanging it; the children themselves
        // are blocking, for the hot path.
        let parent = world.split_parent();
        let config = world.child_config();
        let one_rank_config = one_rank(config);
        let keeper = world.keeper();
        let split = |color: u32, key: i32, config: &Config| -> Result<Comm> {
            let comm = parent
                .split(Some(color), key, Some(config))
                .map_err(|e| world.explain(e))?
                .ok_or_else(split_missing)?;
            watch(&keeper, &comm);
            Ok(comm)
        };
        // In the world's order the whole mesh is the world's communicator:
        // kept (`from_world`) or shared (a second handle, with the world's
        // watch and connections); otherwise a split.
        let in_order = in_world_order(&ranks);
        let own_whole = if in_order && reuse {
            None
        } else if in_order {
            Some(world.comm().share().map_err(|e| world.explain(e))?)
        } else {
            let whole = split(0, position as i32, config)?;
            inherit_ranks(world.comm(), &whole, "mesh", Some(ranks.clone()));
            Some(whole)
        };
        let whole = own_whole.as_ref().unwrap_or(world.comm());
        let mut groups = Vec::new();
        for name in shape.names() {
            let comm = if spans_the_mesh(&shape, name)? {
                None
            } else {
                let (c, k) = shape.split_for(position, &[name])?;
                let alone = shape.axis_size(name)? == 1;
                let comm = split(c, k, if alone { &one_rank_config } else { config })?;
                let members = world_ranks(&shape, &ranks, position, &[name]);
                inherit_ranks(whole, &comm, name, members);
                Some(comm)
            };
            groups.push(Group {
                name: name.to_string(),
                axes: vec![name.to_string()],
                comm,
            });
        }
        Ok(DeviceMesh {
            shape,
            position,
            ranks,
            whole: ManuallyDrop::new(own_whole),
            groups,
            world: None,
            keeper,
            child_config: Some(config.clone()),
        })
    }

    /// The meshes of worlds that one thread drives ([`World::local`]),
    /// split together in one group per axis. Collectives on them go in one
    /// group as well.
    pub fn new_all(
        worlds: &[World],
        axes: &[(&str, usize)],
        placement: Placement,
    ) -> Result<Vec<DeviceMesh>> {
        let n = worlds.len();
        let shape = MeshShape::new(axes, n)?;
        if worlds
            .iter()
            .enumerate()
            .any(|(i, w)| w.rank() != i || w.size() != n)
        {
            return Err(Error::InvalidArgument {
                op: "DeviceMesh::new_all",
                reason: "pass every world of one World::local, in rank order".into(),
            });
        }
        let ranks: Vec<usize> = match placement {
            Placement::RankOrder => (0..n).collect(),
            Placement::NvlinkIslands => {
                let devices: Vec<usize> = worlds.iter().map(World::device).collect();
                ranks_on_one_host(&devices)?
            }
        };
        let mut positions = vec![0; n];
        for (p, &r) in ranks.iter().enumerate() {
            positions[r] = p;
        }
        let world_comms: Vec<&Comm> = worlds.iter().map(World::comm).collect();
        let wholes: Vec<Comm> = if in_world_order(&ranks) {
            // The world's order: each whole mesh shares its world's
            // communicator (and its watch and connections).
            world_comms
                .iter()
                .map(|c| c.share().map_err(Error::from))
                .collect::<Result<_>>()?
        } else {
            let keys: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
            let wholes: Vec<Comm> = Comm::split_all(&world_comms, &vec![Some(0); n], &keys, None)?
                .into_iter()
                .map(|c| c.ok_or_else(split_missing))
                .collect::<Result<_>>()?;
            for (world, whole) in world_comms.iter().zip(&wholes) {
                inherit(world, whole, "mesh");
            }
            wholes
        };
        let comms: Vec<&Comm> = wholes.iter().collect();
        let mut per_rank: Vec<Vec<Group>> = (0..n).map(|_| Vec::new()).collect();
        for name in shape.names() {
            let axes = vec![name.to_string()];
            if spans_the_mesh(&shape, name)? {
                for groups in per_rank.iter_mut() {
                    groups.push(Group {
                        name: name.to_string(),
                        axes: axes.clone(),
                        comm: None,
                    });
                }
                continue;
            }
            let (colors, keys) = splits(&shape, &positions, &[name])?;
            // A one-rank axis bounds its channels; the others inherit.
            let alone = (shape.axis_size(name)? == 1).then(|| one_rank(worlds[0].child_config()));
            let made = Comm::split_all(&comms, &colors, &keys, alone.as_ref())?;
            for ((groups, comm), whole) in per_rank.iter_mut().zip(made).zip(&wholes) {
                let comm = comm.ok_or_else(split_missing)?;
                inherit(whole, &comm, name);
                groups.push(Group {
                    name: name.to_string(),
                    axes: axes.clone(),
                    comm: Some(comm),
                });
            }
        }
        Ok(per_rank
            .into_iter()
            .zip(positions)
            .zip(wholes)
            .map(|((groups, position), whole)| DeviceMesh {
                shape: shape.clone(),
                position,
                ranks: ranks.clone(),
                whole: ManuallyDrop::new(Some(whole)),
                groups,
                world: None,
                keeper: Weak::new(),
                child_config: None,
            })
            .collect())
    }

    /// The shape.
    pub fn shape(&self) -> &MeshShape {
        &self.shape
    }

    /// This rank's coordinate, one entry per axis in mesh order.
    pub fn coordinate(&self) -> Vec<usize> {
        self.shape.coordinate(self.position).unwrap_or_default()
    }

    /// This rank's position in the row-major mesh (its world rank under
    /// [`Placement::RankOrder`]).
    pub fn position(&self) -> usize {
        self.position
    }

    /// The recovery policy after the world ranks `lost` were lost: every
    /// replica along `axis` (data parallelism) that lost a rank is dropped
    /// whole ([`MeshShape::without_replicas`]), so the replicas left keep
    /// their other axes intact. Gives the smaller mesh's shape and the
    /// world ranks that keep a place, in its position order: hand those
    /// to [`World::recover_keeping`] (which numbers the new world's ranks
    /// so) and build the new mesh with [`DeviceMesh::new`] (rank order)
    /// from the shape's [`MeshShape::axes`]. A rank outside the world is
    /// [`MeshError::RankOutOfRange`].
    ///
    /// ```no_run
    /// use nccl_dist::{DeviceMesh, World, WorldOptions};
    ///
    /// let options = WorldOptions::new();
    /// let world = World::init_with(nccl_dist::Launch::detect()?, &options)?;
    /// let mesh = DeviceMesh::new(&world, &[("dp", 2), ("tp", 2)])?;
    /// // ... a step fails with Error::PeerLost ...
    /// let (shape, keep) = mesh.without_replicas("dp", &world.lost_ranks())?;
    /// drop(mesh);
    /// match world.recover_keeping(&keep, &options)? {
    ///     Some(world) => {
    ///         let mesh = DeviceMesh::new(&world, &shape.axes())?;
    ///         // ... go on with the smaller mesh ...
    ///     }
    ///     None => { /* this rank's replica was dropped: a spare now */ }
    /// }
    /// # Ok::<(), nccl_dist::Error>(())
    /// ```
    pub fn without_replicas(&self, axis: &str, lost: &[usize]) -> Result<(MeshShape, Vec<usize>)> {
        let size = self.ranks.len();
        let positions = lost
            .iter()
            .map(|&w| {
                self.ranks
                    .iter()
                    .position(|&r| r == w)
                    .ok_or(MeshError::RankOutOfRange { rank: w, size })
            })
            .collect::<std::result::Result<Vec<usize>, MeshError>>()?;
        let (shape, keep) = self.shape.without_replicas(axis, &positions)?;
        Ok((shape, keep.into_iter().map(|p| self.ranks[p]).collect()))
    }

    /// The world rank at `coord`, if it is inside the mesh.
    pub fn world_rank_of(&self, coord: &[usize]) -> Option<usize> {
        self.shape.rank_of(coord).map(|p| self.ranks[p])
    }

    fn group(&self, name: &str) -> Result<&Group> {
        self.groups
            .iter()
            .find(|g| g.name == name)
            .ok_or_else(|| MeshError::UnknownAxis(name.to_string()).into())
    }

    /// The communicator over the whole mesh, its ranks ordered by mesh
    /// position (so under [`Placement::NvlinkIslands`] neighbours in it
    /// share NVLink).
    pub fn comm(&self) -> &Comm {
        match (&*self.whole, &self.world) {
            (Some(whole), _) => whole,
            (None, Some(world)) => world.comm(),
            // `from_world` is the only maker of a mesh without a whole
            // communicator of its own, and it sets the world.
            (None, None) => {
                unreachable!("a DeviceMesh without its own whole communicator owns its world")
            }
        }
    }

    /// The communicator along `axis` (a mesh axis or a flattened name).
    pub fn axis(&self, axis: &str) -> Result<&Comm> {
        Ok(match &self.group(axis)?.comm {
            Some(comm) => comm,
            None => self.comm(),
        })
    }

    /// Ranks along `axis`.
    pub fn size(&self, axis: &str) -> Result<usize> {
        Ok(self.axis(axis)?.size())
    }

    /// This rank's index along `axis`.
    pub fn local_rank(&self, axis: &str) -> Result<usize> {
        Ok(self.axis(axis)?.rank())
    }

    /// The sub-mesh of `axes` (in the order given), sharing this mesh's
    /// communicators.
    pub fn slice(&self, axes: &[&str]) -> Result<SubMesh<'_>> {
        Ok(SubMesh {
            mesh: self,
            shape: self.shape.slice(axes)?,
        })
    }

    /// A communicator over the adjacent `axes` merged, under `name` (then
    /// `axis(name)`, `size(name)`, `local_rank(name)` work). Collective:
    /// every rank calls it with the same arguments.
    pub fn flatten(&mut self, axes: &[&str], name: &str) -> Result<&Comm> {
        self.check_flatten(axes, name)?;
        let (c, k) = self.shape.split_for(self.position, axes)?;
        let comm = self.comm().split(Some(c), k, self.child_config.as_ref())?;
        let comm = comm.ok_or_else(split_missing)?;
        watch(&self.keeper, &comm);
        self.push_group(axes, name, comm)
    }

    /// [`DeviceMesh::flatten`] on the meshes of [`DeviceMesh::new_all`],
    /// split together in one group.
    pub fn flatten_all(meshes: &mut [DeviceMesh], axes: &[&str], name: &str) -> Result<()> {
        for m in meshes.iter() {
            m.check_flatten(axes, name)?;
        }
        let positions: Vec<usize> = meshes.iter().map(|m| m.position).collect();
        let Some(first) = meshes.first() else {
            return Ok(());
        };
        let (colors, keys) = splits(&first.shape, &positions, axes)?;
        let parents: Vec<&Comm> = meshes.iter().map(DeviceMesh::comm).collect();
        let made = Comm::split_all(&parents, &colors, &keys, None)?;
        for (m, comm) in meshes.iter_mut().zip(made) {
            m.push_group(axes, name, comm.ok_or_else(split_missing)?)?;
        }
        Ok(())
    }

    fn check_flatten(&self, axes: &[&str], name: &str) -> Result<()> {
        self.shape.flatten(axes, name)?;
        if self.groups.iter().any(|g| g.name == name) {
            return Err(MeshError::DuplicateAxis(name.to_string()).into());
        }
        Ok(())
    }

    fn push_group(&mut self, axes: &[&str], name: &str, comm: Comm) -> Result<&Comm> {
        let members = world_ranks(&self.shape, &self.ranks, self.position, axes);
        inherit_ranks(self.comm(), &comm, name, members);
        self.groups.push(Group {
            name: name.to_string(),
            axes: axes.iter().map(|a| a.to_string()).collect(),
            comm: Some(comm),
        });
        self.axis(name)
    }

    /// The axes a name covers (one for a mesh axis, several for a
    /// flattened group).
    pub fn axes_of(&self, name: &str) -> Result<Vec<&str>> {
        Ok(self.group(name)?.axes.iter().map(String::as_str).collect())
    }
}

/// `DeviceMesh`'s forwarders: each collective on the communicator of an
/// axis (or flattened group).
macro_rules! mesh_forwarders {
    ($( $(#[$attr:meta])* $name:ident [$($generics:tt)*] ($($arg:ident : $ty:ty),*); )*) => {
        /// Collectives along one axis (or flattened group): ranks, roots
        /// and peers are indices along it.
        impl DeviceMesh {
            $(
                #[doc = concat!(
                    "[`Comm::", stringify!($name), "`] on the communicator of `axis`."
                )]
                $(#[$attr])*
                pub fn $name<'a, $($generics)*>(
                    &'a self,
                    axis: &str,
                    $($arg: $ty),*
                ) -> Result<()> {
                    Ok(self.axis(axis)?.$name($($arg),*)?)
                }
            )*
        }
    };
}

nccl_safe::for_each_collective!(mesh_forwarders);

/// Some axes of a [`DeviceMesh`], sharing its communicators.
#[derive(Debug)]
pub struct SubMesh<'m> {
    mesh: &'m DeviceMesh,
    shape: MeshShape,
}

impl<'m> SubMesh<'m> {
    /// The sub-shape.
    pub fn shape(&self) -> &MeshShape {
        &self.shape
    }

    /// This rank's coordinate on the sub-mesh's axes.
    pub fn coordinate(&self) -> Vec<usize> {
        let full = self.mesh.coordinate();
        let names = self.mesh.shape.names();
        self.shape
            .names()
            .iter()
            .filter_map(|n| names.iter().position(|m| m == n).map(|i| full[i]))
            .collect()
    }

    /// The communicator along `axis`, one of the sub-mesh's.
    pub fn axis(&self, axis: &str) -> Result<&'m Comm> {
        self.shape.axis_size(axis)?;
        self.mesh.axis(axis)
    }

    /// Ranks along `axis`.
    pub fn size(&self, axis: &str) -> Result<usize> {
        Ok(self.shape.axis_size(axis)?)
    }

    /// This rank's index along `axis`.
    pub fn local_rank(&self, axis: &str) -> Result<usize> {
        Ok(self.axis(axis)?.rank())
    }
}

/// The world rank of each rank of the communicator of `position`'s group
/// along `axes` (the group's mesh positions in key order, each through
/// `ranks`), for the connection gate; `None` when the shape cannot say.
fn world_ranks(
    shape: &MeshShape,
    ranks: &[usize],
    position: usize,
    axes: &[&str],
) -> Option<Vec<usize>> {
    let members = shape.group_members(position, axes).ok()?;
    members.iter().map(|&p| ranks.get(p).copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-rank axis bounds its channels on top of the world's
    /// configuration, unless that configuration bounds them itself.
    #[test]
    fn a_one_rank_axis_bounds_its_channels_unless_the_configuration_does() {
        let plain = one_rank(&Config::new());
        assert_eq!(plain.get_max_ctas(), Some(ONE_RANK_MAX_CTAS));
        assert_eq!(plain.get_min_ctas(), None);
        let own = one_rank(&Config::new().max_ctas(8));
        assert_eq!(own.get_max_ctas(), Some(8));
        let floor = one_rank(&Config::new().min_ctas(16));
        assert_eq!(
            (floor.get_min_ctas(), floor.get_max_ctas()),
            (Some(16), None)
        );
        let timeout = std::time::Duration::from_secs(7);
        let kept = one_rank(&Config::new().blocking(false).timeout(timeout));
        assert!(!kept.is_blocking());
        assert_eq!(kept.get_timeout(), timeout);
    }

    /// An axis that holds every rank keys each rank by its mesh position,
    /// as the whole mesh's split does: so that communicator serves it.
    #[test]
    fn an_axis_over_every_rank_orders_them_as_the_whole_mesh() {
        let shapes: [&[(&str, usize)]; 4] = [
            &[("dp", 1), ("tp", 4)],
            &[("dp", 4), ("tp", 1)],
            &[("pp", 1), ("dp", 8), ("tp", 1)],
            &[("x", 2)],
        ];
        for axes in shapes {
            let n = axes.iter().map(|(_, s)| s).product();
            let shape = MeshShape::new(axes, n).unwrap();
            let spanning: Vec<&str> = shape
                .names()
                .into_iter()
                .filter(|a| spans_the_mesh(&shape, a).unwrap())
                .collect();
            assert_eq!(spanning.len(), 1, "{axes:?}");
            for p in 0..n {
                let (color, key) = shape.split_for(p, &spanning).unwrap();
                assert_eq!(key, p as i32, "{axes:?} position {p}");
                assert_eq!(color, shape.split_for(0, &spanning).unwrap().0);
            }
        }
        let two_by_two = MeshShape::new(&[("dp", 2), ("tp", 2)], 4).unwrap();
        assert!(!spans_the_mesh(&two_by_two, "dp").unwrap());
        assert!(!spans_the_mesh(&two_by_two, "tp").unwrap());
    }
}

//! Effective contributions: one kind merged over an agent's scope chain, the nearest scope
//! winning (R3).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::plugin::model::{Contribution, Scope};
use crate::plugin::registry::{PluginEntry, Registry};

/// One effective contribution while planning: the plugin, the item's index, its effective
/// scope and that scope's rank in the chain.
pub(super) struct Pick<'r> {
    entry: &'r Arc<PluginEntry>,
    index: usize,
    scope: &'r Scope,
    rank: usize,
}

/// An effective contribution: its plugin, the item's index, its effective scope and that
/// scope's rank in the chain.
pub(super) type Picked<'r> = (&'r Arc<PluginEntry>, usize, &'r Scope, usize);

/// Merges one kind of contribution over the chain: the nearest scope wins (R3).
pub(super) fn effective<'r, T: Contribution + 'r>(
    registry: &'r Registry,
    excluded: &BTreeSet<String>,
    chain: &[String],
) -> BTreeMap<&'r str, Picked<'r>> {
    let mut best: BTreeMap<&str, Pick> = BTreeMap::new();
    for entry in registry.plugins().filter(|p| !excluded.contains(&p.id)) {
        for (index, item) in T::all(&entry.declaration).iter().enumerate() {
            let declared = item.scope();
            let scope = match (&entry.options.scope_override, declared) {
                (Some(over), Scope::Global) => over,
                _ => declared,
            };
            let Some(rank) = chain.iter().position(|k| k == scope.key()) else {
                continue; // not visible to this agent
            };
            // Same name in the same scope from two plugins is refused at load (R2), so ranks
            // never tie; on a tie the first plugin by id would win, still deterministically.
            let pick = Pick {
                entry,
                index,
                scope,
                rank,
            };
            match best.entry(item.name()) {
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    if rank > o.get().rank {
                        o.insert(pick);
                    }
                }
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(pick);
                }
            }
        }
    }
    best.into_iter()
        .map(|(name, p)| (name, (p.entry, p.index, p.scope, p.rank)))
        .collect()
}

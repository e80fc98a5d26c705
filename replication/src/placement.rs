//! Replica placement for new partitions: spreads replicas and leaders evenly over the unfenced
//! brokers and, when brokers have racks, puts each partition's replicas on as many racks as it
//! can. The rules are those of Kafka's rack-aware assignment (re-derived here, not copied):
//!
//! 1. Order the brokers so racks alternate: the first broker of each rack, then the second of
//!    each, and so on (racks by name, brokers by id within a rack). A broker without a rack is
//!    in the rack "" of its own kind.
//! 2. Partition `p` gets its leader at position `(p + start) % n` of that list, so consecutive
//!    partitions rotate leadership over brokers and racks.
//! 3. Followers are taken at a distance `1 + (shift + k) % (n - 1)` from the leader, skipping
//!    brokers already chosen and racks that already have a replica until every rack has one.
//!    `shift` grows each time the partitions wrap around the broker list, so the followers of
//!    a leader differ from round to round.
//!
//! `start` and the first `shift` are random per topic, so many small topics do not all lead on
//! the same broker. The caller passes the random source; the placement itself is pure.

use std::collections::BTreeMap;

use rand::Rng;

use crate::records::BrokerId;

/// A broker that can take new replicas.
#[derive(Clone, Debug)]
pub struct PlacementBroker {
    pub id: BrokerId,
    pub rack: Option<String>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum PlacementError {
    /// More replicas asked for than there are usable brokers.
    NotEnoughBrokers {
        replication_factor: i16,
        brokers: usize,
    },
}

/// Assignments for partitions `first_partition .. first_partition + count`, leader first.
pub fn place(
    brokers: &[PlacementBroker],
    first_partition: i32,
    count: i32,
    replication_factor: i16,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<BrokerId>>, PlacementError> {
    let n = brokers.len();
    if replication_factor < 1 || replication_factor as usize > n {
        return Err(PlacementError::NotEnoughBrokers {
            replication_factor,
            brokers: n,
        });
    }
    let arranged = rack_alternated(brokers);
    let rack_of: BTreeMap<BrokerId, &str> = brokers
        .iter()
        .map(|b| (b.id, b.rack.as_deref().unwrap_or("")))
        .collect();
    let rack_count = rack_of
        .values()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let start = rng.gen_range(0..n);
    let mut shift = rng.gen_range(0..n);
    let mut assignments = Vec::with_capacity(count.max(0) as usize);
    for i in 0..count {
        let partition = (first_partition + i) as usize;
        if partition > 0 && partition.is_multiple_of(n) {
            shift += 1;
        }
        let first = (partition + start) % n;
        let leader = arranged[first];
        let mut replicas = vec![leader];
        let mut racks = vec![rack_of[&leader]];
        // Two passes over the other brokers: the first honours the rack rule, and only if a
        // rack is short of brokers does the second fill from anywhere.
        let mut k = 0;
        while replicas.len() < replication_factor as usize && k < 2 * n {
            let step = 1 + (shift * rack_count.max(1) + k) % (n - 1).max(1);
            let candidate = arranged[(first + step) % n];
            let rack = rack_of[&candidate];
            let rack_ok = !racks.contains(&rack) || racks.len() >= rack_count || k >= n;
            if !replicas.contains(&candidate) && rack_ok {
                replicas.push(candidate);
                racks.push(rack);
            }
            k += 1;
        }
        assert_eq!(
            replicas.len(),
            replication_factor as usize,
            "placement found {} of {replication_factor} replicas over {n} brokers",
            replicas.len()
        );
        assignments.push(replicas);
    }
    Ok(assignments)
}

fn rack_alternated(brokers: &[PlacementBroker]) -> Vec<BrokerId> {
    let mut by_rack: BTreeMap<&str, Vec<BrokerId>> = BTreeMap::new();
    for b in brokers {
        by_rack
            .entry(b.rack.as_deref().unwrap_or(""))
            .or_default()
            .push(b.id);
    }
    for ids in by_rack.values_mut() {
        ids.sort();
    }
    let mut arranged = Vec::with_capacity(brokers.len());
    let mut round = 0;
    while arranged.len() < brokers.len() {
        for ids in by_rack.values() {
            if let Some(&id) = ids.get(round) {
                arranged.push(id);
            }
        }
        round += 1;
    }
    arranged
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn brokers(racks: &[&str]) -> Vec<PlacementBroker> {
        racks
            .iter()
            .enumerate()
            .map(|(i, r)| PlacementBroker {
                id: BrokerId(i as i32 + 1),
                rack: (!r.is_empty()).then(|| r.to_string()),
            })
            .collect()
    }

    fn count_by<F: Fn(&Vec<BrokerId>) -> Vec<BrokerId>>(
        a: &[Vec<BrokerId>],
        f: F,
    ) -> BTreeMap<BrokerId, usize> {
        let mut counts = BTreeMap::new();
        for replicas in a {
            for b in f(replicas) {
                *counts.entry(b).or_default() += 1;
            }
        }
        counts
    }

    #[test]
    fn leaders_and_replicas_spread_evenly_without_racks() {
        for seed in 0..20 {
            let mut rng = StdRng::seed_from_u64(seed);
            let a = place(&brokers(&["", "", ""]), 0, 12, 3, &mut rng).unwrap();
            let leaders = count_by(&a, |r| vec![r[0]]);
            assert_eq!(leaders.values().copied().collect::<Vec<_>>(), [4, 4, 4]);
            let replicas = count_by(&a, |r| r.clone());
            assert_eq!(replicas.values().copied().collect::<Vec<_>>(), [12, 12, 12]);
            for r in &a {
                let mut d = r.clone();
                d.sort();
                d.dedup();
                assert_eq!(d.len(), 3);
            }
        }
    }

    #[test]
    fn replicas_of_a_partition_land_on_distinct_racks() {
        let b = brokers(&["a", "a", "b", "b", "c", "c"]);
        let rack = |id: BrokerId| b[(id.0 - 1) as usize].rack.clone().unwrap();
        for seed in 0..20 {
            let mut rng = StdRng::seed_from_u64(seed);
            let a = place(&b, 0, 30, 3, &mut rng).unwrap();
            for r in &a {
                let mut racks: Vec<String> = r.iter().map(|&id| rack(id)).collect();
                racks.sort();
                racks.dedup();
                assert_eq!(racks.len(), 3, "{r:?}");
            }
            let leaders = count_by(&a, |r| vec![r[0]]);
            assert!(leaders.values().all(|&c| c == 5), "{leaders:?}");
        }
    }

    #[test]
    fn uneven_racks_still_fill_every_replica() {
        let b = brokers(&["a", "a", "a", "b"]);
        let mut rng = StdRng::seed_from_u64(1);
        let a = place(&b, 0, 8, 3, &mut rng).unwrap();
        assert!(a.iter().all(|r| r.len() == 3));
        // Rack b has one broker: it appears in every partition it can.
        assert!(a.iter().all(|r| r.contains(&BrokerId(4))));
    }

    #[test]
    fn too_few_brokers_is_an_error() {
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            place(&brokers(&["", ""]), 0, 1, 3, &mut rng),
            Err(PlacementError::NotEnoughBrokers {
                replication_factor: 3,
                brokers: 2
            })
        );
    }
}

//! Which subtask reads which partition, decided alike by every subtask.
//!
//! Partition `p` of topic `t` goes to subtask `(h(t) + p) mod n`, where `h` is FNV-1a of
//! the topic's name: a topic's partitions spread round-robin from a start that differs
//! per topic (as Flink's Kafka enumerator does), so several small topics do not all
//! land on subtask 0. The rule depends on nothing but names and counts, so a subtask
//! that discovers a new partition knows whether it is its own without asking anyone.

/// The subtask (of `parallelism`) that reads `partition` of `topic`.
pub fn owner(topic: &str, partition: i32, parallelism: usize) -> usize {
    let start = fnv1a(topic.as_bytes()) % parallelism.max(1) as u64;
    ((start + partition.max(0) as u64) % parallelism.max(1) as u64) as usize
}

/// The split name of a partition in checkpoints: the same at any parallelism.
pub fn split_name(topic: &str, partition: i32) -> String {
    format!("{topic}/{partition}")
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_partition_has_one_owner_and_owners_are_balanced() {
        for parallelism in 1..=5 {
            let mut load = vec![0usize; parallelism];
            for p in 0..20 {
                let o = owner("bids", p, parallelism);
                assert!(o < parallelism);
                load[o] += 1;
            }
            let (min, max) = (load.iter().min().unwrap(), load.iter().max().unwrap());
            assert!(max - min <= 1, "round robin within a topic: {load:?}");
        }
    }

    #[test]
    fn the_rule_is_stable() {
        // Checkpoints of one version are restored by the next: the rule may not drift.
        assert_eq!(fnv1a(b"bids"), 0xdea1_279b_d099_ada9);
        assert_eq!(owner("t", 0, 1), 0);
        assert_eq!(split_name("bids", 3), "bids/3");
    }
}

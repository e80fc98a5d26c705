//! Metadata changes, committed in the metadata log and published by shard 0's metadata node:
//! every shard applies each new image to the partitions it owns (open new ones, reconfigure,
//! delete).

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use sluice_replication::records::{BrokerId, LeaderEpoch, PartitionEpoch};
use sluice_replication::replica::ReplicaConfig;

use super::partition::{Partition, RoleUpdate};
use super::Shard;
use crate::metadata::{log_config, MetadataImage};

impl Shard {
    /// Has every shard, this one included, apply `image`; each shard's result in shard order.
    pub async fn apply_image_everywhere(
        self: &Rc<Self>,
        image: Arc<MetadataImage>,
    ) -> Vec<Result<(), String>> {
        self.invoke_on_all(move |shard| {
            let image = image.clone();
            async move { shard.apply_image(image).await }
        })
        .await
    }

    /// Leads or follows each of this shard's partitions as `image` says, and starts a replica
    /// fetcher for every leader followed.
    pub(crate) fn update_roles(self: &Rc<Self>, image: &MetadataImage) {
        let Some(view) = image.cluster.as_ref() else {
            return;
        };
        let me = self.config().node_id;
        let lag = self.config().replica_lag_time_max_ms;
        // A node leads nothing until the image holds the registration it made in this run: a
        // restarted node first replays its own copy of the metadata log, which may still name
        // it the leader of partitions that moved while it was down.
        let epoch = self
            .shared
            .broker_epoch
            .load(std::sync::atomic::Ordering::Acquire);
        let registered = epoch >= 0 && view.broker(me).is_some_and(|b| b.epoch == epoch);
        if registered && self.id == 0 && !self.strays_checked.replace(true) {
            self.delete_strays(image);
        }
        let partitions: Vec<((String, i32), Rc<Partition>)> = self
            .partitions
            .borrow()
            .iter()
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect();
        let mut leaders = std::collections::BTreeSet::new();
        let mut min_isr: HashMap<&str, usize> = HashMap::new();
        for ((topic, index), p) in partitions {
            let Some(info) = view.partition(&topic, index) else {
                continue;
            };
            let Some(meta) = image.topics.get(&topic) else {
                continue;
            };
            let min_insync_replicas = *min_isr.entry(meta.name.as_str()).or_insert_with(|| {
                image
                    .effective_topic_configs(me, meta)
                    .get("min.insync.replicas")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(self.config().min_insync_replicas as usize)
            });
            let offsets = topic == crate::group::offsets_topic::OFFSETS_TOPIC;
            let ids = |v: &[i32]| v.iter().map(|&b| BrokerId(b)).collect::<Vec<_>>();
            let (replicas, isr) = (ids(&info.replicas), ids(&info.isr));
            p.update_role(RoleUpdate {
                me: BrokerId(me),
                leader: BrokerId(if registered { info.leader } else { -1 }),
                leader_epoch: LeaderEpoch(info.leader_epoch),
                partition_epoch: PartitionEpoch(info.partition_epoch),
                replicas: &replicas,
                isr: &isr,
                config: ReplicaConfig {
                    replica_lag_time_max_ms: lag,
                    min_insync_replicas,
                },
            });
            if offsets {
                self.on_offsets_leadership(index, &p);
            }
            if topic == crate::txn::TRANSACTION_STATE_TOPIC {
                crate::shard::txn::on_leadership(self, index, &p);
            }
            if topic == crate::share::coordinator::SHARE_STATE_TOPIC {
                crate::shard::share_state::on_leadership(self, index, &p);
            }
            if registered && info.leader >= 0 && info.leader != me {
                leaders.insert(info.leader);
            }
        }
        // Offsets partitions that left this shard take their groups with them.
        let gone: Vec<i32> = self
            .coordinating
            .borrow()
            .keys()
            .copied()
            .filter(|&i| {
                self.partition(crate::group::offsets_topic::OFFSETS_TOPIC, i)
                    .is_none()
            })
            .collect();
        for index in gone {
            self.coordinating.borrow_mut().remove(&index);
            self.shared.set_coordinator(index, false);
            self.unload_groups(index);
        }
        // And `__transaction_state` partitions their transaction coordinators.
        crate::shard::txn::drop_gone(self);
        // And `__share_group_state` partitions their share coordinators.
        crate::shard::share_state::drop_gone(self);
        for leader in leaders {
            super::replication::ensure_fetcher(self, leader);
        }
    }

    /// Deletes the directories of replicas that a reassignment moved off this node while it
    /// was down (Kafka's stray replicas): a partition of a topic in the image that has no
    /// replica here. Only once the image holds this run's registration, so it has every change
    /// committed before, and only in a cluster: the single-node default imports topics from an
    /// older metadata file after it registers. Directories of topics the image does not know
    /// are left alone.
    fn delete_strays(&self, image: &MetadataImage) {
        if !self.config().is_cluster() {
            return;
        }
        let entries = self
            .shared
            .log_dirs
            .dirs()
            .iter()
            .filter_map(|d| std::fs::read_dir(&d.path).ok())
            .flatten();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((topic, index)) = name.rsplit_once('-') else {
                continue;
            };
            if name == crate::config::METADATA_DIR {
                continue;
            }
            let Ok(index) = index.parse::<usize>() else {
                continue;
            };
            let stray = image
                .topics
                .get(topic)
                .is_some_and(|t| t.shards.get(index) == Some(&crate::metadata::NOT_HOSTED));
            if !stray || !entry.path().is_dir() {
                continue;
            }
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => {
                    self.shared.log_dirs.removed(&entry.path());
                    tracing::info!(
                        topic,
                        partition = index,
                        "deleted a replica moved off this node while it was down"
                    )
                }
                Err(e) => {
                    tracing::warn!(dir = %entry.path().display(), error = %e, "could not delete a stray replica")
                }
            }
        }
    }

    /// Moves group coordination with the leadership of `__consumer_offsets` partition `index`:
    /// a new leadership unloads what an earlier one loaded and rebuilds the groups from the log;
    /// the end of one unloads them. Group requests get COORDINATOR_LOAD_IN_PROGRESS until the
    /// load is done, NOT_COORDINATOR once another broker leads.
    pub(crate) fn on_offsets_leadership(self: &Rc<Self>, index: i32, p: &Rc<Partition>) {
        let epoch = p.check_leader(-1).ok().map(|e| e.0);
        let current = self.coordinating.borrow().get(&index).copied();
        if epoch == current {
            return;
        }
        self.shared.set_coordinator(index, false);
        self.unload_groups(index);
        let Some(epoch) = epoch else {
            self.coordinating.borrow_mut().remove(&index);
            return;
        };
        self.coordinating.borrow_mut().insert(index, epoch);
        let shard = self.clone();
        let p = p.clone();
        glommio::spawn_local(async move {
            let still = || shard.coordinating.borrow().get(&index) == Some(&epoch);
            let started = std::time::Instant::now();
            while still() {
                match shard.load_offsets_of(index, &p, still).await {
                    Ok(commits) => {
                        if still() {
                            shard.shared.set_coordinator(index, true);
                            tracing::info!(partition = index, leader_epoch = epoch, commits, elapsed_ms = started.elapsed().as_millis() as u64, "coordinating the groups of __consumer_offsets partition");
                        }
                        return;
                    }
                    Err(e) => {
                        // Never served from a partial view: the groups stay unavailable
                        // (COORDINATOR_LOAD_IN_PROGRESS) and the load starts over.
                        tracing::error!(partition = index, error = %e, "loading the groups of an offsets partition failed; trying again in a second");
                        if !still() {
                            return; // a newer leadership has its own load
                        }
                        shard.unload_groups(index);
                        glommio::timer::sleep(std::time::Duration::from_secs(1)).await;
                    }
                }
            }
        })
        .detach();
    }

    /// Brings this shard's partitions in line with `image`.
    pub async fn apply_image(self: &Rc<Self>, image: Arc<MetadataImage>) -> Result<(), String> {
        // Deleted topics (or a topic re-created under the same name with a new id): drop the
        // partitions and delete their directories.
        let stale: Vec<(String, i32)> = self
            .partitions
            .borrow()
            .keys()
            .filter(|(topic, p)| {
                image
                    .topics
                    .get(topic)
                    .is_none_or(|t| *p as usize >= t.shards.len())
            })
            .cloned()
            .collect();
        // Partitions whose replica left this node (a reassignment moved it, and the replicas
        // it moved to are in sync): their data goes too, as Kafka deletes a removed replica.
        let moved: Vec<(String, i32)> = self
            .partitions
            .borrow()
            .keys()
            .filter(|(topic, p)| {
                image.topics.get(topic).is_some_and(|t| {
                    t.shards.get(*p as usize) == Some(&crate::metadata::NOT_HOSTED)
                })
            })
            .cloned()
            .collect();
        for (key, why) in stale.into_iter().map(|k| (k, "deleted partition")).chain(
            moved
                .into_iter()
                .map(|k| (k, "deleted a replica moved off this node")),
        ) {
            let removed = self.partitions.borrow_mut().remove(&key);
            if let Some(partition) = removed {
                partition.stop_replica();
                if let Err(e) = partition.log.close().await {
                    tracing::warn!(topic = %key.0, partition = key.1, error = %e, "closing a partition before deleting it");
                }
                let dir = partition.log.dir().to_path_buf();
                drop(partition);
                let trash = dir.with_file_name(format!(
                    "{}.{}-delete",
                    key.0,
                    uuid::Uuid::new_v4().simple()
                ));
                if let Err(e) =
                    std::fs::rename(&dir, &trash).and_then(|_| std::fs::remove_dir_all(&trash))
                {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not delete a partition directory");
                }
                self.shared.log_dirs.removed(&dir);
                tracing::info!(topic = %key.0, partition = key.1, "{why}");
            }
        }
        let mut errors = Vec::new();
        for topic in image.topics.values() {
            if let Err(e) = self.open_owned(topic).await {
                errors.push(e.to_string());
            }
            match log_config(&image.effective_topic_configs(self.config().node_id, topic)) {
                Ok(config) => {
                    let ours: Vec<_> = self
                        .partitions
                        .borrow()
                        .iter()
                        .filter(|((t, _), _)| t == &topic.name)
                        .map(|(_, p)| p.clone())
                        .collect();
                    for p in ours {
                        p.log.set_config(config.clone());
                    }
                }
                Err(e) => errors.push(format!("topic {}: {e}", topic.name)),
            }
        }
        *self.image.borrow_mut() = image.clone();
        self.update_roles(&image);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

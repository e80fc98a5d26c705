//! Metadata changes, committed in the metadata log and published by shard 0's metadata node:
//! every shard applies each new image to the partitions it owns (open new ones, reconfigure,
//! delete).

use std::rc::Rc;
use std::sync::Arc;

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
        // Partitions whose replica left this node (a cluster moved it): closed, their data
        // kept, until replication's reassignment deletes what it moved.
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
        for key in moved {
            let removed = self.partitions.borrow_mut().remove(&key);
            if let Some(partition) = removed {
                if let Err(e) = partition.log.close().await {
                    tracing::warn!(topic = %key.0, partition = key.1, error = %e, "closing a partition that left this node");
                }
                tracing::info!(topic = %key.0, partition = key.1, "closed a partition whose replica left this node");
            }
        }
        for key in stale {
            let removed = self.partitions.borrow_mut().remove(&key);
            if let Some(partition) = removed {
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
                    tracing::warn!(dir = %dir.display(), error = %e, "could not delete a deleted topic's partition directory");
                }
                tracing::info!(topic = %key.0, partition = key.1, "deleted partition");
            }
        }
        let mut errors = Vec::new();
        for topic in image.topics.values() {
            match self.open_owned(topic).await {
                // A cluster places offsets partitions here after start: load their commits.
                Ok(opened)
                    if topic.name == crate::group::offsets_topic::OFFSETS_TOPIC
                        && !opened.is_empty() =>
                {
                    if let Err(e) = self.load_offsets_of(opened).await {
                        errors.push(format!("loading committed offsets: {e}"));
                    }
                }
                Ok(_) => {}
                Err(e) => errors.push(e.to_string()),
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
        *self.image.borrow_mut() = image;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

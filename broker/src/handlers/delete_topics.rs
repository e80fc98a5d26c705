//! DeleteTopics, by name or by topic id: removed from the image on shard 0, then every owner
//! shard drops the partitions and deletes their directories.

use std::rc::Rc;

use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{DeleteTopicsRequest, DeleteTopicsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::shard::Shard;

pub async fn handle(
    shard: &Rc<Shard>,
    request: DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    let mut targets: Vec<(Option<String>, uuid::Uuid)> = request
        .topic_names
        .iter()
        .map(|n| (Some(n.0.to_string()), uuid::Uuid::nil()))
        .collect();
    targets.extend(
        request
            .topics
            .iter()
            .map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id)),
    );
    let mut response = DeleteTopicsResponse::default();
    for (name, id) in targets {
        let image = shard.image();
        let found = match &name {
            Some(n) => image.topics.get(n).cloned(),
            None => image.topic_by_id(id).cloned(),
        };
        let mut result = DeletableTopicResult::default()
            .with_name(name.clone().map(|n| TopicName(StrBytes::from_string(n))));
        if version >= 6 {
            result.topic_id = id;
        }
        let Some(topic) = found else {
            result.error_code = if name.is_some() {
                ResponseError::UnknownTopicOrPartition.code()
            } else {
                ResponseError::UnknownTopicId.code()
            };
            response.responses.push(result);
            continue;
        };
        if topic.name == crate::group::offsets_topic::OFFSETS_TOPIC {
            // Kafka refuses to delete its internal topics: groups would lose their offsets.
            result.error_code = ResponseError::InvalidTopicException.code();
            if version >= 5 {
                result.error_message = Some(StrBytes::from_static_str(
                    "internal topics cannot be deleted",
                ));
            }
            response.responses.push(result);
            continue;
        }
        if version >= 6 {
            result.name = Some(TopicName(StrBytes::from_string(topic.name.clone())));
            result.topic_id = topic.id;
        }
        let (doomed, doomed_id) = (topic.name.clone(), topic.id);
        let outcome = shard
            .update_metadata(move |image| match image.topics.get(&doomed) {
                Some(t) if t.id == doomed_id => {
                    image.topics.remove(&doomed);
                    Ok(())
                }
                _ => Err("topic is already gone".to_string()),
            })
            .await;
        match outcome {
            Ok(()) => tracing::info!(topic = %topic.name, "deleted topic"),
            Err(e) => {
                result.error_code = ResponseError::UnknownTopicOrPartition.code();
                if version >= 5 {
                    result.error_message = Some(StrBytes::from_string(e));
                }
            }
        }
        response.responses.push(result);
    }
    response
}

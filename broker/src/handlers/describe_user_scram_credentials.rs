//! DescribeUserScramCredentials (`kafka-configs --describe --entity-type users`): each user's
//! SCRAM mechanisms and iterations from this broker's metadata image, never a salt or a key.
//! Every user with a credential when none is named; for named users, RESOURCE_NOT_FOUND for one
//! without any and DUPLICATE_RESOURCE for one named twice (those first, as in Kafka's answer).

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::metadata::MetadataImage;

pub fn handle(
    request: DescribeUserScramCredentialsRequest,
    image: &MetadataImage,
) -> DescribeUserScramCredentialsResponse {
    let mut response = DescribeUserScramCredentialsResponse::default()
        .with_error_message(Some(StrBytes::from_static_str("")));
    // Mechanism and iterations of every credential, by user.
    let mut stored: BTreeMap<&str, Vec<CredentialInfo>> = BTreeMap::new();
    if let Some(cluster) = image.cluster.as_ref() {
        for ((user, mechanism), c) in &cluster.scram {
            stored.entry(user.as_str()).or_default().push(
                CredentialInfo::default()
                    .with_mechanism(*mechanism)
                    .with_iterations(c.iterations),
            );
        }
    }
    let found = |user: &str, infos: Vec<CredentialInfo>| {
        DescribeUserScramCredentialsResult::default()
            .with_user(StrBytes::from_string(user.to_string()))
            .with_credential_infos(infos)
    };
    let users: Vec<String> = request
        .users
        .unwrap_or_default()
        .into_iter()
        .map(|u| u.name.to_string())
        .collect();
    if users.is_empty() {
        response.results = stored
            .into_iter()
            .map(|(user, infos)| found(user, infos))
            .collect();
        return response;
    }
    let mut distinct: Vec<(&str, bool)> = Vec::new();
    for user in &users {
        match distinct.iter_mut().find(|(u, _)| *u == user.as_str()) {
            Some((_, twice)) => *twice = true,
            None => distinct.push((user, false)),
        }
    }
    distinct.sort_by_key(|&(_, twice)| !twice);
    for (user, twice) in distinct {
        let refused = |code: ResponseError, message: String| {
            DescribeUserScramCredentialsResult::default()
                .with_user(StrBytes::from_string(user.to_string()))
                .with_error_code(code.code())
                .with_error_message(Some(StrBytes::from_string(message)))
        };
        response.results.push(if twice {
            refused(
                ResponseError::DuplicateResource,
                format!("Cannot describe SCRAM credentials for the same user twice in a single request: {user}"),
            )
        } else if let Some(infos) = stored.remove(user) {
            found(user, infos)
        } else {
            refused(
                ResponseError::ResourceNotFound,
                format!("Attempt to describe a user credential that does not exist: {user}"),
            )
        });
    }
    response
}

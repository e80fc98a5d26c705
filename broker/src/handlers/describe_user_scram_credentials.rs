//! DescribeUserScramCredentials: this broker runs SASL PLAIN only, not SCRAM yet, and keeps no
//! SCRAM credentials, so it answers as a Kafka that has none: nothing when every user is asked for,
//! RESOURCE_NOT_FOUND for each user named (DUPLICATE_RESOURCE for one named twice; those come
//! first, as in Kafka's answer).

use kafka_protocol::messages::describe_user_scram_credentials_response::DescribeUserScramCredentialsResult;
use kafka_protocol::messages::{
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

pub fn handle(
    request: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let mut response = DescribeUserScramCredentialsResponse::default()
        .with_error_message(Some(StrBytes::from_static_str("")));
    let users: Vec<String> = request
        .users
        .unwrap_or_default()
        .into_iter()
        .map(|u| u.name.to_string())
        .collect();
    let mut distinct: Vec<(&str, bool)> = Vec::new();
    for user in &users {
        match distinct.iter_mut().find(|(u, _)| *u == user.as_str()) {
            Some((_, twice)) => *twice = true,
            None => distinct.push((user, false)),
        }
    }
    distinct.sort_by_key(|&(_, twice)| !twice);
    for (user, twice) in distinct {
        let (code, message) = if twice {
            (
                ResponseError::DuplicateResource,
                format!("Cannot describe SCRAM credentials for the same user twice in a single request: {user}"),
            )
        } else {
            (
                ResponseError::ResourceNotFound,
                format!("Attempt to describe a user credential that does not exist: {user}"),
            )
        };
        response.results.push(
            DescribeUserScramCredentialsResult::default()
                .with_user(StrBytes::from_string(user.to_string()))
                .with_error_code(code.code())
                .with_error_message(Some(StrBytes::from_string(message))),
        );
    }
    response
}

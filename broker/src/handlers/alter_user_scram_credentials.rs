//! AlterUserScramCredentials: this broker runs SASL PLAIN only (`net/sasl.rs`), not SCRAM yet,
//! so it keeps no SCRAM credentials. Deletions find nothing (RESOURCE_NOT_FOUND, as on a Kafka without credentials);
//! each request is checked as Kafka checks it, and a valid upsertion is refused as a mechanism
//! this broker does not support (`Disabled::Scram`). One result per user, in user name order,
//! as Kafka answers.

use std::collections::BTreeMap;

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::errors::Disabled;

/// SCRAM-SHA-256 and SCRAM-SHA-512.
const MECHANISMS: &[i8] = &[1, 2];
/// Kafka's bounds on SCRAM iterations.
const ITERATIONS_MIN: i32 = 4096;
const ITERATIONS_MAX: i32 = 16384;

pub fn handle(request: AlterUserScramCredentialsRequest) -> AlterUserScramCredentialsResponse {
    // user -> (error, message); the first problem found for a user is its answer.
    let mut results: BTreeMap<String, (i16, String)> = BTreeMap::new();
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for name in request
        .deletions
        .iter()
        .map(|d| d.name.as_str())
        .chain(request.upsertions.iter().map(|u| u.name.as_str()))
    {
        *count.entry(name).or_default() += 1;
    }
    let mut answer = |user: &str, error: ResponseError, message: &str| {
        results
            .entry(user.to_string())
            .or_insert((error.code(), message.to_string()));
    };
    for (user, n) in &count {
        if *n > 1 {
            answer(
                user,
                ResponseError::DuplicateResource,
                "A user credential cannot be altered twice in the same request",
            );
        } else if user.is_empty() {
            answer(
                user,
                ResponseError::UnacceptableCredential,
                "Username must not be empty",
            );
        }
    }
    for d in &request.deletions {
        if !MECHANISMS.contains(&d.mechanism) {
            answer(
                &d.name,
                ResponseError::UnsupportedSaslMechanism,
                "Unknown SCRAM mechanism",
            );
        }
        answer(
            &d.name,
            ResponseError::ResourceNotFound,
            "Attempt to delete a user credential that does not exist",
        );
    }
    for u in &request.upsertions {
        if !MECHANISMS.contains(&u.mechanism) {
            answer(
                &u.name,
                ResponseError::UnsupportedSaslMechanism,
                "Unknown SCRAM mechanism",
            );
        } else if u.iterations < ITERATIONS_MIN {
            answer(
                &u.name,
                ResponseError::UnacceptableCredential,
                "Too few iterations",
            );
        } else if u.iterations > ITERATIONS_MAX {
            answer(
                &u.name,
                ResponseError::UnacceptableCredential,
                "Too many iterations",
            );
        }
    }
    let disabled = Disabled::Scram;
    for u in &request.upsertions {
        results
            .entry(u.name.to_string())
            .or_insert((disabled.code(), disabled.message().to_string()));
    }
    AlterUserScramCredentialsResponse::default().with_results(
        results
            .into_iter()
            .map(|(user, (code, message))| {
                AlterUserScramCredentialsResult::default()
                    .with_user(StrBytes::from_string(user))
                    .with_error_code(code)
                    .with_error_message(Some(StrBytes::from_string(message)))
            })
            .collect(),
    )
}

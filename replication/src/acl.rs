//! ACLs as Kafka's `StandardAuthorizer` keeps and applies them: bindings (a resource pattern and
//! an access control entry), the filters CreateAcls, DescribeAcls and DeleteAcls use, and the
//! decision for one principal, host, operation and resource. Ids are Kafka's wire ids.
//!
//! The decision, in Kafka's order: a super user may do anything; a DENY that matches wins; then
//! an ALLOW that matches (READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies
//! DESCRIBE_CONFIGS; ALL is every operation); a resource no ACL names at all is allowed only
//! with `allow.everyone.if.no.acl.found`. An ACL matches a resource by its literal name, the
//! literal wildcard `*`, or a prefix; a principal by name or `User:*`; a host by address or `*`.

/// Kafka's ResourceType ids.
pub mod resource_type {
    pub const UNKNOWN: i8 = 0;
    pub const ANY: i8 = 1;
    pub const TOPIC: i8 = 2;
    pub const GROUP: i8 = 3;
    pub const CLUSTER: i8 = 4;
    pub const TRANSACTIONAL_ID: i8 = 5;
    pub const DELEGATION_TOKEN: i8 = 6;
    pub const USER: i8 = 7;
}

/// Kafka's PatternType ids.
pub mod pattern_type {
    pub const UNKNOWN: i8 = 0;
    pub const ANY: i8 = 1;
    pub const MATCH: i8 = 2;
    pub const LITERAL: i8 = 3;
    pub const PREFIXED: i8 = 4;
}

/// Kafka's AclOperation ids.
pub mod operation {
    pub const UNKNOWN: i8 = 0;
    pub const ANY: i8 = 1;
    pub const ALL: i8 = 2;
    pub const READ: i8 = 3;
    pub const WRITE: i8 = 4;
    pub const CREATE: i8 = 5;
    pub const DELETE: i8 = 6;
    pub const ALTER: i8 = 7;
    pub const DESCRIBE: i8 = 8;
    pub const CLUSTER_ACTION: i8 = 9;
    pub const DESCRIBE_CONFIGS: i8 = 10;
    pub const ALTER_CONFIGS: i8 = 11;
    pub const IDEMPOTENT_WRITE: i8 = 12;
    pub const CREATE_TOKENS: i8 = 13;
    pub const DESCRIBE_TOKENS: i8 = 14;
    pub const TWO_PHASE_COMMIT: i8 = 15;
}

/// Kafka's AclPermissionType ids.
pub mod permission {
    pub const UNKNOWN: i8 = 0;
    pub const ANY: i8 = 1;
    pub const DENY: i8 = 2;
    pub const ALLOW: i8 = 3;
}

/// The literal resource name that matches every resource of its type.
pub const WILDCARD: &str = "*";
/// The only name of the CLUSTER resource.
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// The principal that matches every user.
pub const WILDCARD_PRINCIPAL: &str = "User:*";

/// One ACL: who (principal, host) may or may not (permission) do what (operation) to which
/// resources (type, name, pattern type).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AclBinding {
    pub resource_type: i8,
    pub resource_name: String,
    pub pattern_type: i8,
    pub principal: String,
    pub host: String,
    pub operation: i8,
    pub permission: i8,
}

/// A filter over ACLs (DescribeAcls, DeleteAcls): `None` and the ANY ids match everything;
/// pattern type MATCH matches the ACLs that apply to the named resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: i8,
    pub resource_name: Option<String>,
    pub pattern_type: i8,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: i8,
    pub permission: i8,
}

impl AclFilter {
    pub fn matches(&self, acl: &AclBinding) -> bool {
        use pattern_type::*;
        if self.resource_type != resource_type::ANY && self.resource_type != acl.resource_type {
            return false;
        }
        if self.pattern_type != ANY
            && self.pattern_type != MATCH
            && self.pattern_type != acl.pattern_type
        {
            return false;
        }
        let name_ok = match &self.resource_name {
            None => true,
            Some(name) if self.pattern_type == ANY || self.pattern_type == acl.pattern_type => {
                *name == acl.resource_name
            }
            // MATCH: the ACLs that apply to this name.
            Some(name) => match acl.pattern_type {
                LITERAL => *name == acl.resource_name || acl.resource_name == WILDCARD,
                PREFIXED => name.starts_with(&acl.resource_name),
                _ => false,
            },
        };
        name_ok
            && self.principal.as_ref().is_none_or(|p| *p == acl.principal)
            && self.host.as_ref().is_none_or(|h| *h == acl.host)
            && (self.operation == operation::ANY || self.operation == acl.operation)
            && (self.permission == permission::ANY || self.permission == acl.permission)
    }

    /// Why this filter can match nothing sensible (Kafka refuses those with INVALID_REQUEST).
    pub fn invalid(&self) -> Option<&'static str> {
        if self.resource_type == resource_type::UNKNOWN {
            return Some("Invalid resource type");
        }
        if self.pattern_type == pattern_type::UNKNOWN {
            return Some("Invalid pattern type");
        }
        if self.operation == operation::UNKNOWN {
            return Some("Invalid operation");
        }
        if self.permission == permission::UNKNOWN {
            return Some("Invalid permission type");
        }
        None
    }
}

impl AclBinding {
    /// Why this ACL cannot be created, in Kafka's words; `None` if it can.
    pub fn invalid(&self) -> Option<String> {
        use resource_type::*;
        if !matches!(
            self.resource_type,
            TOPIC | GROUP | CLUSTER | TRANSACTIONAL_ID | DELEGATION_TOKEN | USER
        ) {
            return Some("Invalid resourceType".into());
        }
        if !matches!(
            self.pattern_type,
            pattern_type::LITERAL | pattern_type::PREFIXED
        ) {
            return Some("Invalid patternType".into());
        }
        if !(operation::ALL..=operation::TWO_PHASE_COMMIT).contains(&self.operation) {
            return Some("Invalid operation".into());
        }
        if !matches!(self.permission, permission::DENY | permission::ALLOW) {
            return Some("Invalid permissionType".into());
        }
        if self.resource_name.is_empty() {
            return Some("Resource name should not be empty".into());
        }
        if self.resource_type == CLUSTER && self.resource_name != CLUSTER_NAME {
            return Some(format!(
                "The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
            ));
        }
        match self.principal.split_once(':') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
            _ => {
                return Some(format!(
                    "Could not parse principal from `{}` (no colon is present separating the principal type from the principal name)",
                    self.principal
                ))
            }
        }
        if self.host.is_empty() {
            return Some("Invalid host".into());
        }
        None
    }

    /// Whether this ACL names `name` (of its resource type): literally, by the wildcard, or
    /// by a prefix.
    fn covers(&self, name: &str) -> bool {
        match self.pattern_type {
            pattern_type::LITERAL => self.resource_name == name || self.resource_name == WILDCARD,
            pattern_type::PREFIXED => name.starts_with(&self.resource_name),
            _ => false,
        }
    }

    fn applies_to(&self, principal: &str, host: &str) -> bool {
        (self.principal == principal || self.principal == WILDCARD_PRINCIPAL)
            && (self.host == host || self.host == WILDCARD)
    }
}

/// What one request asks to do.
#[derive(Clone, Copy, Debug)]
pub struct Action<'a> {
    pub operation: i8,
    pub resource_type: i8,
    pub resource_name: &'a str,
}

/// Who asks.
#[derive(Clone, Copy, Debug)]
pub struct Requester<'a> {
    /// `Type:name`, e.g. `User:alice`.
    pub principal: &'a str,
    /// The client's address, as text.
    pub host: &'a str,
}

/// The authorizer's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthorizerConfig {
    /// `super.users`: principals allowed everything.
    pub super_users: Vec<String>,
    /// `allow.everyone.if.no.acl.found`.
    pub allow_if_no_acl: bool,
}

/// Kafka's decision for `who` doing `action`, given every ACL of the cluster.
pub fn authorize<'a>(
    acls: impl IntoIterator<Item = &'a AclBinding>,
    config: &AuthorizerConfig,
    who: Requester<'_>,
    action: Action<'_>,
) -> bool {
    if config.super_users.iter().any(|s| s == who.principal) {
        return true;
    }
    let mut named = false;
    let mut allowed = false;
    for acl in acls {
        if acl.resource_type != action.resource_type || !acl.covers(action.resource_name) {
            continue;
        }
        named = true;
        if !acl.applies_to(who.principal, who.host) {
            continue;
        }
        let op = action.operation;
        match acl.permission {
            permission::DENY if acl.operation == op || acl.operation == operation::ALL => {
                return false
            }
            permission::ALLOW if allows(acl.operation, op) => allowed = true,
            _ => {}
        }
    }
    if !named {
        return config.allow_if_no_acl;
    }
    allowed
}

/// Whether an ALLOW of `granted` permits `wanted`.
fn allows(granted: i8, wanted: i8) -> bool {
    use operation::*;
    granted == ALL
        || granted == wanted
        || (wanted == DESCRIBE && matches!(granted, READ | WRITE | DELETE | ALTER))
        || (wanted == DESCRIBE_CONFIGS && granted == ALTER_CONFIGS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(
        resource_type: i8,
        name: &str,
        pattern: i8,
        principal: &str,
        op: i8,
        perm: i8,
    ) -> AclBinding {
        AclBinding {
            resource_type,
            resource_name: name.into(),
            pattern_type: pattern,
            principal: principal.into(),
            host: "*".into(),
            operation: op,
            permission: perm,
        }
    }

    fn can(
        acls: &[AclBinding],
        config: &AuthorizerConfig,
        principal: &str,
        op: i8,
        topic: &str,
    ) -> bool {
        authorize(
            acls,
            config,
            Requester {
                principal,
                host: "127.0.0.1",
            },
            Action {
                operation: op,
                resource_type: resource_type::TOPIC,
                resource_name: topic,
            },
        )
    }

    use operation::*;
    use pattern_type::{LITERAL, PREFIXED};
    use permission::{ALLOW, DENY};
    use resource_type::TOPIC;

    #[test]
    fn standard_authorizer_rules() {
        let config = AuthorizerConfig {
            super_users: vec!["User:admin".into()],
            allow_if_no_acl: false,
        };
        let acls = vec![
            acl(TOPIC, "orders", LITERAL, "User:alice", READ, ALLOW),
            acl(TOPIC, "pay-", PREFIXED, "User:alice", WRITE, ALLOW),
            acl(TOPIC, "pay-secret", LITERAL, "User:alice", ALL, DENY),
            acl(TOPIC, "*", LITERAL, "User:bob", DESCRIBE, ALLOW),
            acl(TOPIC, "cfg", LITERAL, "User:*", ALTER_CONFIGS, ALLOW),
        ];
        // Literal, implied DESCRIBE, not WRITE.
        assert!(can(&acls, &config, "User:alice", READ, "orders"));
        assert!(can(&acls, &config, "User:alice", DESCRIBE, "orders"));
        assert!(!can(&acls, &config, "User:alice", WRITE, "orders"));
        // Prefixed; a DENY on one name under the prefix wins.
        assert!(can(&acls, &config, "User:alice", WRITE, "pay-in"));
        assert!(!can(&acls, &config, "User:alice", WRITE, "pay-secret"));
        assert!(!can(&acls, &config, "User:alice", DESCRIBE, "pay-secret"));
        // The wildcard resource, and a wildcard principal with ALTER_CONFIGS implying
        // DESCRIBE_CONFIGS but not DESCRIBE.
        assert!(can(&acls, &config, "User:bob", DESCRIBE, "anything"));
        assert!(!can(&acls, &config, "User:bob", READ, "orders"));
        assert!(can(&acls, &config, "User:carol", DESCRIBE_CONFIGS, "cfg"));
        assert!(!can(&acls, &config, "User:carol", DESCRIBE, "cfg"));
        // A super user may do anything; a resource no ACL names follows the setting.
        assert!(can(&acls, &config, "User:admin", WRITE, "pay-secret"));
        let bare: Vec<AclBinding> = acls
            .iter()
            .filter(|a| a.resource_name != "*")
            .cloned()
            .collect();
        assert!(!can(&bare, &config, "User:carol", READ, "nobody-names-it"));
        let open = AuthorizerConfig {
            allow_if_no_acl: true,
            ..config.clone()
        };
        assert!(can(&bare, &open, "User:carol", READ, "nobody-names-it"));
        // ...but not one that has ACLs, even for others.
        assert!(!can(&bare, &open, "User:carol", READ, "orders"));
        // Hosts.
        let mut from_host = acl(TOPIC, "h", LITERAL, "User:dan", READ, ALLOW);
        from_host.host = "10.0.0.1".into();
        assert!(!can(&[from_host.clone()], &config, "User:dan", READ, "h"));
        from_host.host = "127.0.0.1".into();
        assert!(can(&[from_host], &config, "User:dan", READ, "h"));
    }

    #[test]
    fn filters_match_as_kafkas() {
        let lit = acl(TOPIC, "orders", LITERAL, "User:alice", READ, ALLOW);
        let wild = acl(TOPIC, "*", LITERAL, "User:alice", READ, ALLOW);
        let pre = acl(TOPIC, "ord", PREFIXED, "User:alice", READ, ALLOW);
        let filter = |pattern: i8, name: Option<&str>| AclFilter {
            resource_type: resource_type::ANY,
            resource_name: name.map(str::to_string),
            pattern_type: pattern,
            principal: None,
            host: None,
            operation: ANY,
            permission: permission::ANY,
        };
        let matched = |f: &AclFilter| -> Vec<bool> {
            [&lit, &wild, &pre].iter().map(|a| f.matches(a)).collect()
        };
        assert_eq!(
            matched(&filter(pattern_type::ANY, None)),
            [true, true, true]
        );
        assert_eq!(
            matched(&filter(pattern_type::ANY, Some("orders"))),
            [true, false, false]
        );
        assert_eq!(matched(&filter(LITERAL, None)), [true, true, false]);
        assert_eq!(
            matched(&filter(PREFIXED, Some("ord"))),
            [false, false, true]
        );
        assert_eq!(
            matched(&filter(pattern_type::MATCH, Some("orders"))),
            [true, true, true]
        );
        assert_eq!(
            matched(&filter(pattern_type::MATCH, Some("other"))),
            [false, true, false]
        );
        let mut by_principal = filter(pattern_type::ANY, None);
        by_principal.principal = Some("User:bob".into());
        assert_eq!(matched(&by_principal), [false, false, false]);
        let mut by_op = filter(pattern_type::ANY, None);
        by_op.operation = WRITE;
        assert_eq!(matched(&by_op), [false, false, false]);
    }

    #[test]
    fn invalid_acls_are_named() {
        let ok = acl(TOPIC, "t", LITERAL, "User:a", READ, ALLOW);
        assert_eq!(ok.invalid(), None);
        let mut bad = ok.clone();
        bad.pattern_type = pattern_type::MATCH;
        assert_eq!(bad.invalid().as_deref(), Some("Invalid patternType"));
        let mut bad = ok.clone();
        bad.principal = "alice".into();
        assert!(bad.invalid().unwrap().contains("Could not parse principal"));
        let mut bad = ok.clone();
        bad.resource_type = resource_type::CLUSTER;
        assert!(bad.invalid().unwrap().contains("kafka-cluster"));
        let mut bad = ok;
        bad.operation = ANY;
        assert_eq!(bad.invalid().as_deref(), Some("Invalid operation"));
    }
}

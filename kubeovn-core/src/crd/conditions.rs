//! Conditions as Kube-OVN keeps them on Subnet (and other) statuses: `Ready`, `Validated`, `Error`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;

use super::common::Condition;
use super::SubnetStatus;

/// Condition types Kube-OVN uses.
pub mod condition_types {
    /// The controller considers the resource ready.
    pub const READY: &str = "Ready";
    /// The spec passed validation.
    pub const VALIDATED: &str = "Validated";
    /// The last error seen.
    pub const ERROR: &str = "Error";
    /// The controller is initialising the resource.
    pub const INIT: &str = "Init";
}

/// Reasons Kube-OVN's controller writes.
pub mod reasons {
    /// A condition added before the controller looked (status `Unknown`).
    pub const INIT: &str = "Init";
    /// Reconciliation finished (`Ready`).
    pub const RECONCILE_SUCCESS: &str = "ReconcileSuccess";
    /// A centralized subnet has no ready gateway (`Ready` = False).
    pub const NO_READY_GATEWAY: &str = "NoReadyGateway";
    /// The switch's private ACLs were set.
    pub const SET_PRIVATE_SWITCH_SUCCESS: &str = "SetPrivateLogicalSwitchSuccess";
    /// Setting the switch's private ACLs failed.
    pub const SET_PRIVATE_SWITCH_FAILED: &str = "SetPrivateLogicalSwitchFailed";
    /// The switch's ACLs were reset (not private).
    pub const RESET_SWITCH_ACL_SUCCESS: &str = "ResetLogicalSwitchAclSuccess";
    /// Resetting the switch's ACLs failed.
    pub const RESET_SWITCH_ACL_FAILED: &str = "ResetLogicalSwitchAclFailed";
    /// The subnet spec is valid (`Validated`).
    pub const VALIDATE_SUCCESS: &str = "ValidateLogicalSwitchSuccess";
    /// The subnet spec is invalid (`Validated` = False).
    pub const VALIDATE_FAILED: &str = "ValidateLogicalSwitchFailed";
    /// A subnet whose provider is not OVN was accepted.
    pub const SET_NON_OVN_SUBNET_SUCCESS: &str = "SetNonOvnSubnetSuccess";
    /// `ClearError`'s reason.
    pub const NO_ERROR: &str = "NoError";
}

/// The body of a merge patch on a status subresource: `status` holds only the fields to set, so the rest of
/// the status (a Subnet's counters beside its conditions) is left as it is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatusPatch<T> {
    /// The fields to set.
    pub status: T,
}

/// A status's conditions alone, for a [`StatusPatch`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConditionsOnly<'a> {
    /// The whole list (a merge patch replaces lists).
    pub conditions: &'a [Condition],
}

impl<'a> StatusPatch<ConditionsOnly<'a>> {
    /// Sets the conditions to `conditions`.
    pub fn conditions(conditions: &'a [Condition]) -> Self {
        StatusPatch {
            status: ConditionsOnly { conditions },
        }
    }
}

/// Condition list operations, as Kube-OVN's `SetCondition` / `ClearCondition` behave: the update time moves on
/// every change, the transition time only when the status changes, and an identical write changes nothing.
pub trait Conditions {
    /// The conditions.
    fn conditions(&self) -> &[Condition];
    /// The conditions, mutable.
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;

    /// The condition of type `ty`.
    fn condition(&self, ty: &str) -> Option<&Condition> {
        self.conditions().iter().find(|c| c.type_ == ty)
    }

    /// True when the condition of type `ty` has status `True`.
    fn is_condition_true(&self, ty: &str) -> bool {
        self.condition(ty).is_some_and(|c| c.status == "True")
    }

    /// Sets the condition `ty` to `status`; returns whether anything changed.
    fn set_condition_status(
        &mut self,
        ty: &str,
        status: &str,
        reason: &str,
        message: &str,
        now: &Time,
    ) -> bool {
        let list = self.conditions_mut();
        match list.iter_mut().find(|c| c.type_ == ty) {
            None => {
                list.push(Condition {
                    type_: ty.to_owned(),
                    status: status.to_owned(),
                    reason: reason.to_owned(),
                    message: message.to_owned(),
                    observed_generation: 0,
                    last_update_time: Some(now.clone()),
                    last_transition_time: Some(now.clone()),
                });
                true
            }
            Some(c) if c.status == status && c.reason == reason && c.message == message => false,
            Some(c) => {
                c.last_update_time = Some(now.clone());
                if c.status != status {
                    c.last_transition_time = Some(now.clone());
                }
                c.status = status.to_owned();
                c.reason = reason.to_owned();
                c.message = message.to_owned();
                true
            }
        }
    }

    /// Sets `ty` to `True`.
    fn set_condition(&mut self, ty: &str, reason: &str, message: &str, now: &Time) -> bool {
        self.set_condition_status(ty, "True", reason, message, now)
    }

    /// Sets `ty` to `False`.
    fn clear_condition(&mut self, ty: &str, reason: &str, message: &str, now: &Time) -> bool {
        self.set_condition_status(ty, "False", reason, message, now)
    }

    /// Removes the condition `ty`.
    fn remove_condition(&mut self, ty: &str) {
        self.conditions_mut().retain(|c| c.type_ != ty);
    }

    /// Adds `ty` as `Unknown` (reason `Init`) if absent.
    fn ensure_condition(&mut self, ty: &str, now: &Time) {
        if self.condition(ty).is_none() {
            self.set_condition_status(ty, "Unknown", reasons::INIT, "Not Observed", now);
        }
    }
}

impl Conditions for Vec<Condition> {
    fn conditions(&self) -> &[Condition] {
        self
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        self
    }
}

impl Conditions for SubnetStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

impl SubnetStatus {
    /// Adds `Ready`, `Validated` and `Error` as `Unknown` where absent.
    pub fn ensure_standard_conditions(&mut self, now: &Time) {
        for ty in [
            condition_types::READY,
            condition_types::VALIDATED,
            condition_types::ERROR,
        ] {
            self.ensure_condition(ty, now);
        }
    }

    /// `Ready` = True.
    pub fn ready(&mut self, reason: &str, message: &str, now: &Time) -> bool {
        self.set_condition(condition_types::READY, reason, message, now)
    }

    /// `Ready` = False.
    pub fn not_ready(&mut self, reason: &str, message: &str, now: &Time) -> bool {
        self.clear_condition(condition_types::READY, reason, message, now)
    }

    /// `Validated` = True.
    pub fn validated(&mut self, reason: &str, message: &str, now: &Time) -> bool {
        self.set_condition(condition_types::VALIDATED, reason, message, now)
    }

    /// `Validated` = False.
    pub fn not_validated(&mut self, reason: &str, message: &str, now: &Time) -> bool {
        self.clear_condition(condition_types::VALIDATED, reason, message, now)
    }

    /// `Error` = True with the error.
    pub fn set_error(&mut self, reason: &str, message: &str, now: &Time) -> bool {
        self.set_condition(condition_types::ERROR, reason, message, now)
    }

    /// `Error` = False (`NoError`, "No error seen"), as Kube-OVN clears it.
    pub fn clear_error(&mut self, now: &Time) -> bool {
        self.clear_condition(
            condition_types::ERROR,
            reasons::NO_ERROR,
            "No error seen",
            now,
        )
    }

    /// `Ready` is True.
    pub fn is_ready(&self) -> bool {
        self.is_condition_true(condition_types::READY)
    }

    /// `Validated` is True.
    pub fn is_validated(&self) -> bool {
        self.is_condition_true(condition_types::VALIDATED)
    }
}

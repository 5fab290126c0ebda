//! Raw operations, for the tables the specs do not cover (`Load_Balancer_Group`, `HA_Chassis_Group`, `BFD`,
//! `Meter`'s bands, `QoS`, ...), committed in the same transaction as a batch's specs, with their results
//! read back typed.

use std::sync::{Arc, OnceLock};

use super::{NbError, Planner};
use crate::error::Error;
use crate::model::Model;
use crate::ops::{Operation, OperationResult};
use crate::uuid::Uuid;

/// A raw operation of a [`super::Batch`], sent as is after the batch's planned changes (in the order added).
/// Nothing is diffed: it is sent on every commit of its batch. The replica is not waited for on its behalf
/// (its table is usually not replicated). Its uuid-name, if any, must not be one the planner uses (`r`
/// followed by digits).
///
/// ```no_run
/// # async fn demo(nb: &kubeovn_ovn::northbound::OvsdbNorthbound) -> Result<(), kubeovn_ovn::Error> {
/// use kubeovn_ovn::models::nb::LoadBalancerGroup;
/// use kubeovn_ovn::northbound::{Batch, Northbound};
/// use kubeovn_ovn::ops::{Condition, Operation};
/// use kubeovn_ovn::{Datum, Model};
///
/// let lb = nb.load_balancer("svc1").expect("committed before");
/// let mut b = Batch::new();
/// let group = b.raw(
///     Operation::insert(LoadBalancerGroup::TABLE)
///         .uuid_name("group")
///         .value(LoadBalancerGroup::NAME, "cluster-lbs")
///         .value(LoadBalancerGroup::LOAD_BALANCER, Datum::uuid(lb.uuid)),
/// );
/// let row = b.raw(
///     Operation::select(LoadBalancerGroup::TABLE)
///         .filter(Condition::eq("_uuid", Datum::named_uuid("group"))),
/// );
/// nb.commit(b).await?;
/// let uuid = group.uuid()?;
/// let read: Vec<LoadBalancerGroup> = row.rows()?;
/// assert_eq!(read[0].uuid, uuid);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RawOp {
    /// The operation.
    pub op: Operation,
    result: Arc<OnceLock<OperationResult>>,
}

impl PartialEq for RawOp {
    fn eq(&self, other: &Self) -> bool {
        self.op == other.op
    }
}

impl RawOp {
    /// `op`, with the handle its result is read from after the commit.
    pub fn new(op: impl Into<Operation>) -> (Self, RawResult) {
        let result = Arc::new(OnceLock::new());
        let handle = RawResult(result.clone());
        (
            RawOp {
                op: op.into(),
                result,
            },
            handle,
        )
    }

    /// Records the server's result (the first one, if the batch is committed more than once).
    pub(crate) fn set_result(&self, r: OperationResult) {
        let _ = self.result.set(r);
    }
}

/// The result of a [`RawOp`], available once its batch is committed.
#[derive(Debug, Clone)]
pub struct RawResult(Arc<OnceLock<OperationResult>>);

impl RawResult {
    /// The server's result; None until the batch is committed.
    pub fn get(&self) -> Option<&OperationResult> {
        self.0.get()
    }

    fn expect<T>(
        &self,
        expected: &'static str,
        f: impl FnOnce(&OperationResult) -> Option<T>,
    ) -> Result<T, Error> {
        let r = self.get().ok_or(NbError::RawResult {
            expected,
            found: "nothing (the batch was not committed)".into(),
        })?;
        f(r).ok_or_else(|| {
            NbError::RawResult {
                expected,
                found: format!("{r:?}"),
            }
            .into()
        })
    }

    /// The inserted row's UUID (an insert).
    pub fn uuid(&self) -> Result<Uuid, Error> {
        self.expect("an insert's UUID", OperationResult::uuid)
    }

    /// The number of rows matched (an update, mutate or delete).
    pub fn count(&self) -> Result<u64, Error> {
        self.expect("a count", OperationResult::count)
    }

    /// The selected rows as models (a select; include `_uuid` in its columns to have the rows' UUIDs).
    pub fn rows<M: Model>(&self) -> Result<Vec<M>, Error> {
        let rows = self.expect("selected rows", |r| r.rows().map(<[_]>::to_vec))?;
        rows.iter()
            .map(|r| M::from_select_row(r).map_err(Error::from))
            .collect()
    }
}

/// Whether the planner may name a row `name` (`r1`, `r2`, ...).
fn planner_name(name: &str) -> bool {
    name.strip_prefix('r')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl Planner<'_, '_> {
    /// Checks a raw operation (it is appended after the planned ones by [`super::OvsdbNorthbound::plan`]).
    pub(super) fn raw(&mut self, r: &RawOp) -> Result<(), Error> {
        if let Operation::Insert {
            uuid_name: Some(n), ..
        } = &r.op
        {
            if planner_name(n) {
                return Err(NbError::ReservedName(n.clone()).into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_read_typed_and_refuse_the_wrong_shape() {
        let (op, h) = RawOp::new(Operation::delete("BFD"));
        let e = h.count().unwrap_err();
        assert!(matches!(e, Error::Nb(NbError::RawResult { .. })), "{e:?}");
        op.set_result(OperationResult::Count(2));
        assert_eq!(h.count().unwrap(), 2);
        let e = h.uuid().unwrap_err();
        assert!(
            matches!(e, Error::Nb(NbError::RawResult { expected, .. }) if expected.contains("UUID"))
        );
        assert!(planner_name("r12") && !planner_name("r") && !planner_name("group"));
    }
}

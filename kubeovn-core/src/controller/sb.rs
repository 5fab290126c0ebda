//! The southbound, where the controller has one thing to do: a deleted node's chassis goes (Kube-OVN's
//! `gcChassis`), so that no tunnel or port binding keeps pointing at a node that is gone. The connection is
//! made for the deletion and dropped after (nodes go rarely); with raft, to the leader.

use std::time::Duration;

use kubeovn_ovn::ops::{Condition, Operation, Transaction};
use kubeovn_ovn::session::Session;

use super::error::{ControllerError, Result};

/// The southbound database's name.
const SB_DB: &str = "OVN_Southbound";

/// Deletes chassis `name` (its `Chassis` row, whose `Encap` rows go with it, and its `Chassis_Private` row)
/// from the southbound at `remotes` (comma-separated; writes go to the raft leader). Absent: nothing to do.
pub(crate) async fn delete_chassis(remotes: &str, name: &str) -> Result<()> {
    let err = |e: kubeovn_ovn::Error| ControllerError::Nb(std::sync::Arc::new(e));
    let session = Session::builder(remotes)
        .map_err(err)?
        .leader_only(SB_DB)
        .retry_for(Some(Duration::from_secs(10)))
        .connect()
        .await
        .map_err(err)?;
    let client = session.client().await.map_err(err)?;
    let txn = Transaction::new(SB_DB)
        .op(Operation::delete("Chassis_Private").filter(Condition::eq("name", name)))
        .op(Operation::delete("Chassis").filter(Condition::eq("name", name)));
    client.transact(&txn).await.map_err(err)?;
    Ok(())
}

/// The southbound as the controller uses it: injected, so node deletion is tested without a database.
#[async_trait::async_trait]
pub trait Southbound: Send + Sync + 'static {
    /// Removes chassis `name` (absent: nothing to do).
    async fn delete_chassis(&self, name: &str) -> Result<()>;
}

/// The real southbound at comma-separated `remotes`, connected for each deletion.
#[derive(Debug, Clone)]
pub struct SbRemote(pub String);

#[async_trait::async_trait]
impl Southbound for SbRemote {
    async fn delete_chassis(&self, name: &str) -> Result<()> {
        delete_chassis(&self.0, name).await
    }
}

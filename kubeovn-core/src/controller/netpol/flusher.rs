//! The writer of the marked sets and namespace groups, a task on the framework.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::controller::error::ControllerError;
use crate::controller::framework::{Action, Key, Task};
use crate::controller::Ctx;

/// How long a policy's run waits for its sets to be written before it is retried.
use super::state::*;

/// Writes the marked sets and namespace groups, one batch at a time: a task on the framework, each run
/// waiting for the next mark.
pub(crate) struct Flusher {
    st: Arc<NetpolState>,
}

impl Flusher {
    /// The flusher of `st`.
    pub fn new(st: Arc<NetpolState>) -> Self {
        Flusher { st }
    }
}

#[async_trait::async_trait]
impl Task<Ctx> for Flusher {
    type Error = ControllerError;
    const NAME: &'static str = "netpol-flusher";

    async fn run(&self, ctx: &Arc<Ctx>) -> Result<Action, ControllerError> {
        let st = &self.st;
        st.wake.notified().await;
        let policies = || {
            ctx.kinds
                .list::<NetworkPolicy>()
                .iter()
                .map(|np| owner_of(&Key::of(np.as_ref())))
                .collect()
        };
        let exists = |g: &str| ctx.nb.port_group(g).is_some();
        let (b, generation, sets, groups) = st.take(&policies, &exists);
        if b.is_empty() {
            st.flushed.send_replace(generation);
            return Ok(Action::Requeue(Duration::ZERO));
        }
        match ctx.writer.commit(b).await {
            Ok(()) => {
                st.flushed.send_replace(generation);
                Ok(Action::Requeue(Duration::ZERO))
            }
            Err(e) => {
                // Marked again and retried (the queue's backoff) with whatever came meanwhile.
                st.retake(sets, groups);
                st.wake.notify_one();
                Err(e)
            }
        }
    }
}

//! The reservation kind: users' IP records (`ips.kubeovn.io` not labelled `ip_reserved=false`) held in the
//! allocator while they exist, so an address reserved is never handed to a pod and one unreserved serves
//! the pods waiting for one (an [`AddressesFreed`] signal).

use std::sync::Arc;

use kubeovn_ipam::Allocation;

use super::api::{Listed, RESERVED_LABEL};
use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Reconciler, Watch};
use super::podstore::PodStore;
use super::reservations::held_by_live_pod;
use super::views::AddressesFreed;
use super::{Ctx, PodInfo};
use crate::crd::IP;

/// The reservation kind.
#[derive(Debug, Default)]
pub(crate) struct IpReservations;

fn keep(ctx: &Ctx) -> impl Fn(&Allocation) -> bool + '_ {
    move |a: &Allocation| {
        ctx.kinds
            .store_as::<PodInfo, PodStore>()
            .is_some_and(|pods| held_by_live_pod(pods, a))
    }
}

fn freed(ctx: &Ctx, subnets: impl IntoIterator<Item = String>) {
    for s in subnets {
        ctx.kinds.emit(&AddressesFreed(s));
    }
}

#[async_trait::async_trait]
impl Reconciler<Ctx> for IpReservations {
    type Object = IP;
    type Error = ControllerError;
    const NAME: &'static str = "ip";

    fn watch(&self) -> Watch<IP> {
        Watch {
            labels: Some(format!("{RESERVED_LABEL}!=false")),
            trim: |_| {},
        }
    }

    async fn reconcile(&self, ctx: &Arc<Ctx>, ip: Arc<IP>) -> Result<Action> {
        let Some(name) = ip.metadata.name.clone() else {
            return Ok(Action::Done);
        };
        let r = Listed::new(name, ip.metadata.labels.as_ref(), &ip.spec);
        // Records of the controller written before its label existed match the selector too; one the
        // controller took over, or that names no address any more, is no longer a reservation.
        let keep = keep(ctx);
        let released = match r.allocation().filter(|_| !r.ours) {
            Some(a) => ctx.views.reservations().set(&ctx.ipam, &r.name, a, &keep),
            None => ctx
                .views
                .reservations()
                .remove(&ctx.ipam, &r.name, &keep)
                .into_iter()
                .collect(),
        };
        freed(ctx, released);
        Ok(Action::Done)
    }

    async fn cleanup(&self, ctx: &Arc<Ctx>, key: &Key<IP>, _: Option<Arc<IP>>) -> Result<Action> {
        let keep = keep(ctx);
        let released = ctx
            .views
            .reservations()
            .remove(&ctx.ipam, key.name(), &keep);
        freed(ctx, released);
        Ok(Action::Done)
    }

    /// The reservations the rebuild restored whose records were deleted before the first list: released
    /// (the watch's first list sends no delete for them).
    async fn at_start(&self, ctx: &Arc<Ctx>) -> Result<()> {
        let keep = keep(ctx);
        let released = {
            let mut r = ctx.views.reservations();
            r.listing();
            for ip in ctx.kinds.list::<IP>() {
                if let Some(n) = ip.metadata.name.as_deref() {
                    r.seen(n);
                }
            }
            r.listed(&ctx.ipam, &keep)
        };
        freed(ctx, released);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::IPSpec;
    use kube::api::{Api, DeleteParams, PostParams};
    use std::collections::BTreeMap;

    /// A user's IP record `name` reserving `ip` in `subnet`, labelled `ip_reserved=<reserved>` if given.
    fn user_record(name: &str, subnet: &str, ip: &str, reserved: Option<&str>) -> IP {
        let mut o = IP::new(
            name,
            IPSpec {
                subnet: subnet.into(),
                ip_address: ip.into(),
                ..IPSpec::default()
            },
        );
        o.metadata.labels =
            reserved.map(|v| BTreeMap::from([(RESERVED_LABEL.to_owned(), v.to_owned())]));
        o
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_users_record_holds_its_address_against_pods_until_it_goes() {
        use crate::annotations::IP_ADDRESS;
        use crate::controller::framework::Key;
        use crate::controller::testing::{pod, Harness};

        let mut h = Harness::start().await;
        h.serve_kind::<IpReservations>();
        let ips: Api<IP> = Api::all(h.client.clone());
        let pp = PostParams::default();
        // No label (Kube-OVN's documented reservation) and `ip_reserved=true`: reservations. One labelled
        // `false` is the controller's own record, not a reservation.
        for (name, ip, label) in [
            ("keep", "10.16.0.50", None),
            ("keep-too", "10.16.0.51", Some("true")),
            ("ours", "10.16.0.52", Some("false")),
        ] {
            ips.create(&pp, &user_record(name, "ovn-default", ip, label))
                .await
                .expect("create ip");
        }
        h.until("reservations held", || {
            h.holder("10.16.0.50").as_deref() == Some("keep")
                && h.holder("10.16.0.51").as_deref() == Some("keep-too")
        })
        .await;
        assert_eq!(h.holder("10.16.0.52"), None);

        // A pod asking for a reserved address is refused (no blind retries: the release wakes it).
        h.create_pod(&pod("default", "a", &[(IP_ADDRESS, "10.16.0.50")], None))
            .await;
        let e = h
            .run_pod(Key::namespaced("default", "a"))
            .await
            .expect_err("reserved");
        assert!(e.is_permanent(), "{e}");
        assert_eq!(h.holder("10.16.0.50").as_deref(), Some("keep"));

        // The record goes: the address is free, the pod woken and given it.
        ips.delete("keep", &DeleteParams::default())
            .await
            .expect("delete");
        h.until("reservation released", || h.holder("10.16.0.50").is_none())
            .await;
        assert!(h.waiting("ovn-default").contains(&"default/a".to_owned()));
        h.run_pod(Key::namespaced("default", "a"))
            .await
            .expect("served");
        assert_eq!(h.holder("10.16.0.50").as_deref(), Some("a.default"));
        assert_eq!(h.holder("10.16.0.51").as_deref(), Some("keep-too"));
    }

    /// Kube-OVN's way to fix a pod's address ahead: a record named like the pod's port, naming the pod. The
    /// pod gets that address; the controller then owns the record, and the address goes with the pod.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reservation_named_like_a_pods_port_gives_the_pod_its_address() {
        use crate::annotations::IP_ADDRESS;
        use crate::controller::framework::Key;
        use crate::controller::testing::{pod, Harness};

        let mut h = Harness::start().await;
        h.serve_kind::<IpReservations>();
        let ips: Api<IP> = Api::all(h.client.clone());
        let mut r = user_record("a.default", "ovn-default", "10.16.0.120", None);
        r.spec.namespace = "default".into();
        r.spec.pod_name = "a".into();
        ips.create(&PostParams::default(), &r)
            .await
            .expect("create ip");
        h.until("reserved", || {
            h.holder("10.16.0.120").as_deref() == Some("a.default")
        })
        .await;

        let key = Key::namespaced("default", "a");
        h.create_pod(&pod("default", "a", &[], None)).await;
        h.run_pod(key.clone()).await.expect("run");
        let p: crate::controller::PodInfo = h.get_in("default", "a").await.expect("pod");
        assert_eq!(
            p.annotation_map().get(IP_ADDRESS).map(String::as_str),
            Some("10.16.0.120")
        );
        // The record is the controller's now (the watch drops it as a reservation, the pod keeps it).
        let rec = ips.get("a.default").await.expect("record");
        assert!(crate::controller::api::is_ours(
            rec.metadata.labels.as_ref()
        ));
        // A later record, seen after the take-over, shows the watch handled it.
        ips.create(
            &PostParams::default(),
            &user_record("probe", "ovn-default", "10.16.0.121", None),
        )
        .await
        .expect("probe");
        h.until("probe", || {
            h.holder("10.16.0.121").as_deref() == Some("probe")
        })
        .await;
        assert_eq!(h.holder("10.16.0.120").as_deref(), Some("a.default"));

        // The pod goes: its record and address with it.
        Api::<crate::controller::PodInfo>::namespaced(h.client.clone(), "default")
            .delete("a", &DeleteParams::default())
            .await
            .expect("delete pod");
        h.gone(&key).await;
        h.run_pod(key).await.expect("cleanup");
        assert!(ips.get_opt("a.default").await.expect("get").is_none());
        assert_eq!(h.holder("10.16.0.120"), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reservation_moved_or_dropped_frees_its_address_for_waiting_pods() {
        use crate::annotations::LOGICAL_SWITCH;
        use crate::controller::framework::Key;
        use crate::controller::testing::{pod, Harness};
        use crate::crd::{Decoded, Subnet, SubnetSpec};

        let mut h = Harness::start().await;
        // One free address, 10.72.0.2, reserved before any pod asks.
        let s = Subnet::new(
            "small",
            SubnetSpec {
                cidr_block: "10.72.0.0/29".into(),
                exclude_ips: vec!["10.72.0.3..10.72.0.6".into()],
                ..SubnetSpec::default()
            },
        );
        let s = Api::<Subnet>::all(h.client.clone())
            .create(&PostParams::default(), &s)
            .await
            .expect("subnet");
        h.stored(&Decoded::new(s)).await;
        h.run_subnet(Key::cluster("small")).await.expect("subnet");
        h.serve_kind::<IpReservations>();
        let ips: Api<IP> = Api::all(h.client.clone());
        ips.create(
            &PostParams::default(),
            &user_record("r", "small", "10.72.0.2", None),
        )
        .await
        .expect("create ip");
        h.until("reserved", || h.holder("10.72.0.2").as_deref() == Some("r"))
            .await;

        // The subnet is full for pods: the pod waits.
        let key = Key::namespaced("default", "p");
        h.create_pod(&pod("default", "p", &[(LOGICAL_SWITCH, "small")], None))
            .await;
        let e = h.run_pod(key.clone()).await.expect_err("full");
        assert!(!e.is_permanent(), "{e}");
        assert_eq!(h.waiting("small"), vec!["default/p".to_owned()]);

        // Moved to the default subnet: its old address is freed and serves the pod.
        let mut moved = ips.get("r").await.expect("get");
        moved.spec.subnet = "ovn-default".into();
        moved.spec.ip_address = "10.16.0.99".into();
        ips.replace("r", &PostParams::default(), &moved)
            .await
            .expect("replace");
        h.until("moved", || {
            h.holder("10.72.0.2").is_none() && h.holder("10.16.0.99").as_deref() == Some("r")
        })
        .await;
        h.run_pod(key).await.expect("served");
        assert_eq!(h.holder("10.72.0.2").as_deref(), Some("p.default"));
        assert!(h.waiting("small").is_empty());

        // Dropped: freed.
        ips.delete("r", &DeleteParams::default())
            .await
            .expect("delete");
        h.until("released", || h.holder("10.16.0.99").is_none())
            .await;
    }
}

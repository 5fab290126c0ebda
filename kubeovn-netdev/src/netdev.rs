//! The [`Netdev`] trait (one network namespace's links, addresses, routes and sysctls) and its netlink
//! implementation [`NetlinkNetdev`]; the [`Namespaces`] trait for named namespaces and [`NamedNetns`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use futures::TryStreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use rtnetlink::packet_route::link::{
    AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InfoData, InfoKind, InfoVeth, LinkAttribute,
    LinkFlags, LinkInfo, LinkMessage, State,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{LinkMessageBuilder, LinkUnspec, LinkVeth};

use crate::error::{nl_errno, Error, Result, ENODEV};
use crate::ethtool;
use crate::nat::{self, NatRules};
use crate::netns::{create_named_netns, delete_named_netns, in_netns, Ctx, Worker, NETNS_RUN_DIR};
use crate::types::{
    sysctl_path, validate_ifname, Address, Link, Mac, NetOp, OperState, Route, RouteSpec, VethPair,
    VethSpec,
};

const ENOENT: i32 = 2;
const EEXIST: i32 = 17;
const ESRCH: i32 = 3;
const EADDRNOTAVAIL: i32 = 99;
const EAFNOSUPPORT: i32 = 97;
const RT_TABLE_MAIN: u32 = 254;

/// One network namespace's devices, seen from the node agent.
///
/// **Async, through `async-trait`**: the daemon is a tokio program, and every call is a round trip to the thread
/// that lives in the namespace, so callers await instead of blocking a runtime worker. A sync caller can use
/// `tokio::runtime::Builder::new_current_thread().build()?.block_on(..)`.
///
/// Creating what exists with the same parameters succeeds; deleting what is absent succeeds. The `mock` feature
/// generates `MockNetdev` (mockall).
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait Netdev: Send + Sync {
    /// Creates a veth pair: `spec.host_name` in this namespace, `spec.peer_name` created directly inside
    /// `spec.peer_netns` (`IFLA_NET_NS_FD` on the peer, no move afterwards). Both ends stay down unless
    /// `spec.host_up` or a step brings one up.
    ///
    /// If a veth named `spec.host_name` already exists with the asked MTU, this succeeds (the peer is not checked).
    /// Then runs `spec.then` on the host end and `spec.peer_then` on the pod end in the same round trip (a pair
    /// this call created is deleted again if a step fails; on a new pair, steps its create request did are
    /// skipped) and returns the ends as they are afterwards.
    async fn create_veth(&self, spec: &VethSpec) -> Result<VethPair>;

    /// The link named `name`, or `None`.
    async fn link(&self, name: &str) -> Result<Option<Link>>;

    /// All links of the namespace.
    async fn links(&self) -> Result<Vec<Link>>;

    /// Sets `name` administratively up or down.
    async fn set_link_up(&self, name: &str, up: bool) -> Result<()>;

    /// Sets the MTU of `name`.
    async fn set_link_mtu(&self, name: &str, mtu: u32) -> Result<()>;

    /// Sets the hardware address of `name`.
    async fn set_link_mac(&self, name: &str, mac: Mac) -> Result<()>;

    /// Deletes link `name` (for a veth, both ends go). Absent is success.
    async fn delete_link(&self, name: &str) -> Result<()>;

    /// Adds `addr` (address/prefix) to `link`. Already present is success.
    async fn add_address(&self, link: &str, addr: IpNetwork) -> Result<()>;

    /// Adds `addr` as [`add_address`](Netdev::add_address) does, an IPv6 one without duplicate address
    /// detection (`IFA_F_NODAD`).
    async fn add_address_no_dad(&self, link: &str, addr: IpNetwork) -> Result<()>;

    /// Stops the kernel generating IPv6 addresses for `link` (addrgenmode none; see
    /// [`NetOp::Ipv6AddrGenNone`]). A kernel without IPv6 is success.
    async fn set_ipv6_addr_gen_none(&self, link: &str) -> Result<()>;

    /// Turns TX checksum offload off on `link` (see [`NetOp::TxChecksumOff`]).
    async fn set_tx_checksum_off(&self, link: &str) -> Result<()>;

    /// Removes `addr` from `link`. Absent (or the link absent) is success.
    async fn del_address(&self, link: &str, addr: IpNetwork) -> Result<()>;

    /// Addresses of `link` (an error if the link is absent).
    async fn addresses(&self, link: &str) -> Result<Vec<Address>>;

    /// Addresses of every link.
    async fn all_addresses(&self) -> Result<Vec<Address>>;

    /// Adds a route to the main table. The same route (destination, gateway, device) present is success; the
    /// destination present with another gateway or device is [`Error::Conflict`].
    async fn add_route(&self, route: &RouteSpec) -> Result<()>;

    /// Deletes a route from the main table. Absent is success.
    async fn del_route(&self, route: &RouteSpec) -> Result<()>;

    /// IPv4 and IPv6 routes of the main table.
    async fn routes(&self) -> Result<Vec<Route>>;

    /// Writes a sysctl of this namespace through `/proc/sys` (`net.ipv6.conf.eth0.accept_dad` or the slash form).
    async fn set_sysctl(&self, key: &str, value: &str) -> Result<()>;

    /// Reads a sysctl of this namespace, trailing newline removed.
    async fn sysctl(&self, key: &str) -> Result<String>;

    /// Replaces NAT table `table` of this namespace (nftables families `ip` and `ip6`) with `rules`, atomically in one
    /// netlink batch; rules with nothing for a family remove that family's table. Idempotent.
    ///
    /// A family has nothing when no source is in it. The name must be 1 to 255 bytes without NUL
    /// ([`Error::InvalidTableName`]); a refusal by the kernel is [`Error::Nftables`], and leaves the tables as
    /// they were. The batch is one netlink datagram: one larger than the socket's send buffer
    /// (`net.core.wmem_default`, 208 KiB by default: some 800 rules) is refused with `EMSGSIZE`.
    async fn set_nat(&self, table: &str, rules: &NatRules) -> Result<()>;

    /// Runs `ops` in order and stops at the first failure, returning its error (the steps before it stay
    /// done). [`NetlinkNetdev`] runs them all in one round trip to its thread; this default calls the
    /// single-step methods.
    async fn apply(&self, ops: &[NetOp]) -> Result<()> {
        for op in ops {
            match op {
                NetOp::Sysctl {
                    key,
                    value,
                    missing_ok,
                } => match self.set_sysctl(key, value).await {
                    Err(e) if *missing_ok && e.errno() == Some(ENOENT) => {}
                    r => r?,
                },
                NetOp::SetUp { link, up } => self.set_link_up(link, *up).await?,
                NetOp::SetMtu { link, mtu } => self.set_link_mtu(link, *mtu).await?,
                NetOp::SetMac { link, mac } => self.set_link_mac(link, *mac).await?,
                NetOp::AddAddress {
                    link,
                    addr,
                    no_dad: false,
                } => self.add_address(link, *addr).await?,
                NetOp::AddAddress {
                    link,
                    addr,
                    no_dad: true,
                } => self.add_address_no_dad(link, *addr).await?,
                NetOp::Ipv6AddrGenNone { link } => self.set_ipv6_addr_gen_none(link).await?,
                NetOp::AddRoute(r) => self.add_route(r).await?,
                NetOp::TxChecksumOff { link } => self.set_tx_checksum_off(link).await?,
            }
        }
        Ok(())
    }
}

/// Named network namespaces and handles into them: the sandbox side of the plumbing. The `mock` feature generates
/// `MockNamespaces`.
#[cfg_attr(feature = "mock", mockall::automock)]
pub trait Namespaces: Send + Sync {
    /// Creates namespace `name` and returns its path. Existing is success.
    fn create(&self, name: &str) -> Result<PathBuf>;

    /// Deletes namespace `name`. Absent is success.
    fn delete(&self, name: &str) -> Result<()>;

    /// The path namespace `name` has (or would have).
    fn path(&self, name: &str) -> PathBuf;

    /// A [`Netdev`] inside the namespace at `path` (a named one, `/proc/PID/ns/net`, a CNI `CNI_NETNS`).
    fn open(&self, path: &Path) -> Result<Arc<dyn Netdev>>;
}

/// [`Namespaces`] under a directory, [`NETNS_RUN_DIR`] (`/var/run/netns`) by default, as `ip netns` keeps them.
#[derive(Clone, Debug)]
pub struct NamedNetns {
    dir: PathBuf,
}

impl Default for NamedNetns {
    fn default() -> Self {
        NamedNetns {
            dir: PathBuf::from(NETNS_RUN_DIR),
        }
    }
}

impl NamedNetns {
    /// Namespaces kept under `dir` instead of `/var/run/netns`.
    pub fn with_dir(dir: impl Into<PathBuf>) -> Self {
        NamedNetns { dir: dir.into() }
    }
}

impl Namespaces for NamedNetns {
    fn create(&self, name: &str) -> Result<PathBuf> {
        create_named_netns(&self.dir, name)
    }

    fn delete(&self, name: &str) -> Result<()> {
        delete_named_netns(&self.dir, name)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn open(&self, path: &Path) -> Result<Arc<dyn Netdev>> {
        Ok(Arc::new(NetlinkNetdev::open(path)?))
    }
}

/// The netlink [`Netdev`]: a dedicated thread that entered the namespace (`setns`) and opened its rtnetlink
/// socket there, fed over a channel. Cloning shares the thread; it ends when the last clone is dropped.
#[derive(Clone)]
pub struct NetlinkNetdev {
    worker: Worker,
    /// The namespace's path (None: the process's own), for the deletion worker.
    path: Option<PathBuf>,
    /// A second thread and socket, started on the first [`Netdev::delete_link`]: the kernel unregisters a link
    /// in the deleting thread's `sendmsg` and waits there for RCU grace periods (~20 ms a link here), so
    /// deletions in the background (a CNI DEL's veth) would otherwise hold up every request queued behind them
    /// (after 200 DELs, the next ADDs waited 3.5 s for a link lookup).
    deleter: std::sync::OnceLock<Worker>,
}

impl std::fmt::Debug for NetlinkNetdev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetlinkNetdev")
            .field("netns", &self.worker.netns())
            .finish()
    }
}

impl NetlinkNetdev {
    async fn dump_addresses(&self, link: Option<String>) -> Result<Vec<Address>> {
        self.worker
            .call(move |ctx| async move {
                let mut req = ctx.handle.address().get();
                if let Some(l) = &link {
                    req = req.set_link_index_filter(link_index(&ctx, l).await?);
                }
                let mut s = req.execute();
                let mut out = Vec::new();
                while let Some(a) = s.try_next().await.map_err(|e| {
                    Error::netlink(
                        "dump addresses",
                        link.clone().unwrap_or_default(),
                        &ctx.netns,
                        e,
                    )
                })? {
                    out.extend(to_address(&a));
                }
                Ok(out)
            })
            .await
    }

    /// A handle on the namespace the process is in (the node's root namespace for the daemon).
    pub fn current() -> Result<Self> {
        Ok(NetlinkNetdev {
            worker: Worker::spawn_ready(None)?,
            path: None,
            deleter: std::sync::OnceLock::new(),
        })
    }

    /// A handle on the namespace at `path`: `/var/run/netns/NAME`, `/proc/PID/ns/net`, a CNI `CNI_NETNS`.
    /// Returns at once: the thread enters the namespace and opens its socket while the first requests queue
    /// (a failure to do so is their error).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Ok(NetlinkNetdev {
            worker: Worker::spawn(Some(path.as_ref()))?,
            path: Some(path.as_ref().to_owned()),
            deleter: std::sync::OnceLock::new(),
        })
    }

    /// The worker that deletes links: its own thread once started, the main one if that cannot start.
    fn deleter(&self) -> &Worker {
        if let Some(w) = self.deleter.get() {
            return w;
        }
        match Worker::spawn(self.path.as_deref()) {
            Ok(w) => self.deleter.get_or_init(|| w),
            Err(_) => &self.worker,
        }
    }

    /// The namespace's label used in errors: its path, or `current`.
    pub fn netns(&self) -> &str {
        self.worker.netns()
    }
}

async fn get_link(ctx: &Ctx, name: &str) -> Result<Option<LinkMessage>> {
    let mut s = ctx
        .handle
        .link()
        .get()
        .match_name(name.to_string())
        .execute();
    match s.try_next().await {
        Ok(m) => Ok(m),
        Err(e) if nl_errno(&e) == Some(ENODEV) => Ok(None),
        Err(e) => Err(Error::netlink("get link", name, &ctx.netns, e)),
    }
}

/// The link named `name`; its absence is [`Error::LinkNotFound`].
async fn existing_link(ctx: &Ctx, name: &str) -> Result<LinkMessage> {
    get_link(ctx, name)
        .await?
        .ok_or_else(|| Error::LinkNotFound {
            link: name.to_string(),
            netns: ctx.netns.to_string(),
        })
}

async fn link_index(ctx: &Ctx, name: &str) -> Result<u32> {
    Ok(existing_link(ctx, name).await?.header.index)
}

fn to_link(m: &LinkMessage) -> Link {
    let mut link = Link {
        index: m.header.index,
        name: String::new(),
        mac: None,
        mtu: 0,
        admin_up: m.header.flags.contains(LinkFlags::Up),
        oper_state: OperState::Unknown,
        kind: None,
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Address(b) => link.mac = crate::types::mac_from_slice(b),
            LinkAttribute::Mtu(v) => link.mtu = *v,
            LinkAttribute::OperState(s) => {
                link.oper_state = match s {
                    State::Up => OperState::Up,
                    State::Down => OperState::Down,
                    State::LowerLayerDown => OperState::LowerLayerDown,
                    State::NotPresent => OperState::NotPresent,
                    State::Testing => OperState::Testing,
                    State::Dormant => OperState::Dormant,
                    _ => OperState::Unknown,
                }
            }
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        link.kind = Some(k.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    link
}

fn to_address(m: &AddressMessage) -> Option<Address> {
    let mut addr = None;
    for a in &m.attributes {
        match a {
            // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer on point-to-point links.
            AddressAttribute::Local(ip) => addr = Some(*ip),
            AddressAttribute::Address(ip) if addr.is_none() => addr = Some(*ip),
            _ => {}
        }
    }
    let addr = IpNetwork::new(addr?, m.header.prefix_len).ok()?;
    Some(Address {
        link_index: m.header.index,
        addr,
    })
}

fn route_addr(ip: IpAddr) -> RouteAddress {
    match ip {
        IpAddr::V4(v) => RouteAddress::Inet(v),
        IpAddr::V6(v) => RouteAddress::Inet6(v),
    }
}

fn from_route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

fn to_route(m: &RouteMessage) -> Option<Route> {
    let mut table = u32::from(m.header.table);
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(d) => dst = from_route_addr(d),
            RouteAttribute::Gateway(g) => gateway = from_route_addr(g),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    let dst = dst.unwrap_or(match m.header.address_family {
        AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    });
    let dst = IpNetwork::new(dst, m.header.destination_prefix_length).ok()?;
    Some(Route {
        dst,
        gateway,
        oif,
        table,
    })
}

fn route_message(
    dst: IpNetwork,
    gateway: Option<IpAddr>,
    oif: Option<u32>,
    delete: bool,
) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = if dst.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    m.header.destination_prefix_length = dst.prefix();
    m.header.table = RouteHeader::RT_TABLE_MAIN;
    if delete {
        // Like `ip route del`: match any protocol, scope and type.
        m.header.scope = RouteScope::NoWhere;
    } else {
        m.header.protocol = RouteProtocol::Boot;
        m.header.scope = if gateway.is_some() {
            RouteScope::Universe
        } else {
            RouteScope::Link
        };
        m.header.kind = RouteType::Unicast;
    }
    if dst.prefix() > 0 {
        m.attributes
            .push(RouteAttribute::Destination(route_addr(dst.ip())));
    }
    if let Some(gw) = gateway {
        m.attributes.push(RouteAttribute::Gateway(route_addr(gw)));
    }
    if let Some(i) = oif {
        m.attributes.push(RouteAttribute::Oif(i));
    }
    m
}

async fn dump_routes(ctx: &Ctx) -> Result<Vec<Route>> {
    let mut out = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut q = RouteMessage::default();
        q.header.address_family = family;
        let mut s = ctx.handle.route().get(q).execute();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(|e| Error::netlink("dump routes", "", &ctx.netns, e))?
        {
            if m.header.kind != RouteType::Unicast {
                continue;
            }
            if let Some(r) = to_route(&m) {
                if r.table == RT_TABLE_MAIN {
                    out.push(r);
                }
            }
        }
    }
    Ok(out)
}

async fn set_link(ctx: &Ctx, name: &str, op: &'static str, msg: LinkMessage) -> Result<()> {
    match ctx.handle.link().set(msg).execute().await {
        Ok(()) => Ok(()),
        Err(e) if nl_errno(&e) == Some(ENODEV) => Err(Error::LinkNotFound {
            link: name.to_string(),
            netns: ctx.netns.to_string(),
        }),
        Err(e) => Err(Error::netlink(op, name, &ctx.netns, e)),
    }
}

#[async_trait]
impl Netdev for NetlinkNetdev {
    async fn create_veth(&self, spec: &VethSpec) -> Result<VethPair> {
        validate_ifname(&spec.host_name)?;
        validate_ifname(&spec.peer_name)?;
        for op in spec.then.iter().chain(&spec.peer_then) {
            op.validate()?;
        }
        let spec = spec.clone();
        self.worker
            .call(move |ctx| async move {
                // Opened once: the veth's peer is created in it, and the pod-end steps visit it.
                let peer_ns = std::fs::File::open(&spec.peer_netns).map_err(|e| {
                    Error::io(
                        "open netns",
                        spec.peer_netns.display().to_string(),
                        &ctx.netns,
                        e,
                    )
                })?;
                let created = add_veth(&ctx, &spec, &peer_ns).await?;
                match configure_pair(&ctx, &spec, &peer_ns, created).await {
                    Ok((host, peer)) => Ok(VethPair {
                        created,
                        host,
                        peer,
                    }),
                    Err(e) => {
                        if created {
                            // Leave nothing half-made: the caller sees an error and no new pair.
                            let msg = LinkUnspec::new_with_name(&spec.host_name).build();
                            let _ = ctx.handle.link().del_with_message(msg).execute().await;
                        }
                        Err(e)
                    }
                }
            })
            .await
    }

    async fn link(&self, name: &str) -> Result<Option<Link>> {
        validate_ifname(name)?;
        let name = name.to_string();
        self.worker
            .call(move |ctx| async move { Ok(get_link(&ctx, &name).await?.map(|m| to_link(&m))) })
            .await
    }

    async fn links(&self) -> Result<Vec<Link>> {
        self.worker
            .call(move |ctx| async move {
                let mut s = ctx.handle.link().get().execute();
                let mut out = Vec::new();
                while let Some(m) = s
                    .try_next()
                    .await
                    .map_err(|e| Error::netlink("dump links", "", &ctx.netns, e))?
                {
                    out.push(to_link(&m));
                }
                Ok(out)
            })
            .await
    }

    async fn set_link_up(&self, name: &str, up: bool) -> Result<()> {
        self.apply(&[NetOp::SetUp {
            link: name.to_string(),
            up,
        }])
        .await
    }

    async fn set_link_mtu(&self, name: &str, mtu: u32) -> Result<()> {
        self.apply(&[NetOp::SetMtu {
            link: name.to_string(),
            mtu,
        }])
        .await
    }

    async fn set_link_mac(&self, name: &str, mac: Mac) -> Result<()> {
        self.apply(&[NetOp::SetMac {
            link: name.to_string(),
            mac,
        }])
        .await
    }

    async fn delete_link(&self, name: &str) -> Result<()> {
        validate_ifname(name)?;
        let name = name.to_string();
        self.deleter()
            .call(move |ctx| async move {
                let msg = LinkUnspec::new_with_name(&name).build();
                match ctx.handle.link().del_with_message(msg).execute().await {
                    Ok(()) => Ok(()),
                    Err(e) if nl_errno(&e) == Some(ENODEV) => Ok(()),
                    Err(e) => Err(Error::netlink("del link", name.clone(), &ctx.netns, e)),
                }
            })
            .await
    }

    async fn add_address(&self, link: &str, addr: IpNetwork) -> Result<()> {
        self.apply(&[NetOp::address(link, addr)]).await
    }

    async fn add_address_no_dad(&self, link: &str, addr: IpNetwork) -> Result<()> {
        self.apply(&[NetOp::address_no_dad(link, addr)]).await
    }

    async fn set_ipv6_addr_gen_none(&self, link: &str) -> Result<()> {
        self.apply(&[NetOp::ipv6_addr_gen_none(link)]).await
    }

    async fn set_tx_checksum_off(&self, link: &str) -> Result<()> {
        self.apply(&[NetOp::tx_checksum_off(link)]).await
    }

    async fn del_address(&self, link: &str, addr: IpNetwork) -> Result<()> {
        validate_ifname(link)?;
        let link = link.to_string();
        self.worker
            .call(move |ctx| async move {
                let Some(m) = get_link(&ctx, &link).await? else {
                    return Ok(());
                };
                let mut s = ctx
                    .handle
                    .address()
                    .get()
                    .set_link_index_filter(m.header.index)
                    .execute();
                let mut found = None;
                while let Some(a) = s
                    .try_next()
                    .await
                    .map_err(|e| Error::netlink("dump addresses", link.clone(), &ctx.netns, e))?
                {
                    if to_address(&a).map(|x| x.addr) == Some(addr) {
                        found = Some(a);
                    }
                }
                let Some(a) = found else { return Ok(()) };
                match ctx.handle.address().del(a).execute().await {
                    Ok(()) => Ok(()),
                    Err(e) if nl_errno(&e) == Some(EADDRNOTAVAIL) => Ok(()),
                    Err(e) => Err(Error::netlink(
                        "del address",
                        format!("{addr} dev {link}"),
                        &ctx.netns,
                        e,
                    )),
                }
            })
            .await
    }

    async fn addresses(&self, link: &str) -> Result<Vec<Address>> {
        validate_ifname(link)?;
        self.dump_addresses(Some(link.to_string())).await
    }

    async fn all_addresses(&self) -> Result<Vec<Address>> {
        self.dump_addresses(None).await
    }

    async fn add_route(&self, route: &RouteSpec) -> Result<()> {
        self.apply(&[NetOp::AddRoute(route.clone())]).await
    }

    async fn del_route(&self, route: &RouteSpec) -> Result<()> {
        let dst = route.normalized_dst()?;
        let spec = route.clone();
        self.worker
            .call(move |ctx| async move {
                let oif = match &spec.dev {
                    Some(d) => match get_link(&ctx, d).await? {
                        Some(m) => Some(m.header.index),
                        None => return Ok(()),
                    },
                    None => None,
                };
                let msg = route_message(dst, spec.gateway, oif, true);
                match ctx.handle.route().del(msg).execute().await {
                    Ok(()) => Ok(()),
                    Err(e) if nl_errno(&e) == Some(ESRCH) => Ok(()),
                    Err(e) => Err(Error::netlink("del route", spec.to_string(), &ctx.netns, e)),
                }
            })
            .await
    }

    async fn routes(&self) -> Result<Vec<Route>> {
        self.worker
            .call(move |ctx| async move { dump_routes(&ctx).await })
            .await
    }

    async fn set_sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.apply(&[NetOp::sysctl(key, value)]).await
    }

    async fn sysctl(&self, key: &str) -> Result<String> {
        let path = sysctl_path(key)?;
        self.worker
            .call(move |ctx| async move {
                let s = std::fs::read_to_string(&path).map_err(|e| {
                    Error::io("read sysctl", path.display().to_string(), &ctx.netns, e)
                })?;
                Ok(s.trim_end_matches('\n').to_string())
            })
            .await
    }

    async fn set_nat(&self, table: &str, rules: &NatRules) -> Result<()> {
        let batch = nat::batch(table, rules)?;
        let table = table.to_string();
        self.worker
            .call(move |ctx| async move {
                // The socket is opened here, on the thread inside the namespace: it belongs to that namespace.
                nat::commit(&ctx.netns, &table, &batch)
            })
            .await
    }

    async fn apply(&self, ops: &[NetOp]) -> Result<()> {
        for op in ops {
            op.validate()?;
        }
        let ops = ops.to_vec();
        self.worker
            .call(move |ctx| async move {
                for op in &ops {
                    run_op(&ctx, op).await?;
                }
                Ok(())
            })
            .await
    }
}

/// Whether the request that created the pair already did `op` (on the host end, or the pod end with `peer`).
fn done_by_create(spec: &VethSpec, op: &NetOp, peer: bool) -> bool {
    let (name, mac) = if peer {
        (&spec.peer_name, spec.peer_mac)
    } else {
        (&spec.host_name, spec.host_mac)
    };
    match op {
        NetOp::SetMtu { link, mtu } => link == name && spec.mtu == Some(*mtu),
        NetOp::SetMac { link, mac: m } => link == name && mac == Some(*m),
        NetOp::SetUp { link, up: true } => !peer && link == name && spec.host_up,
        _ => false,
    }
}

/// Runs a new or found pair's steps: the host end's, then the pod end's over a socket opened in its namespace
/// (on a new pair, without those its create request did); returns both ends as they are afterwards.
async fn configure_pair(
    ctx: &Ctx,
    spec: &VethSpec,
    peer_ns: &std::fs::File,
    created: bool,
) -> Result<(Link, Option<Link>)> {
    let redundant = |op: &NetOp, peer: bool| created && done_by_create(spec, op, peer);
    // `host_up` as a first step: the create request did it on a new pair, a found one gets it here.
    let host_up = spec.host_up.then(|| NetOp::up(&spec.host_name));
    for op in host_up.iter().chain(&spec.then) {
        if !redundant(op, false) {
            run_op(ctx, op).await?;
        }
    }
    let peer = if spec.peer_then.is_empty() {
        None
    } else {
        let label: Arc<str> = spec.peer_netns.display().to_string().into();
        // One short visit to the pod's namespace: its sysctls (/proc/sys/net resolves against the calling
        // thread's namespace), ethtool requests (a generic netlink socket opened there) and a netlink socket,
        // which stays bound to it. No thread per pod.
        let opened = in_netns(peer_ns, &label, || -> Result<_> {
            for op in spec.peer_then.iter().filter(|op| op.runs_in_thread_netns()) {
                run_thread_op(&label, op)?;
            }
            rtnetlink::new_connection_with_socket::<netlink_sys::TokioSocket>()
                .map_err(|e| Error::io("open netlink socket", label.to_string(), &label, e))
        })??;
        let (conn, handle, _) = opened;
        // The connection ends when `peer_ctx` (its last handle) is dropped below.
        tokio::spawn(conn);
        let peer_ctx = Ctx {
            handle,
            netns: label,
        };
        for op in &spec.peer_then {
            if !op.runs_in_thread_netns() && !redundant(op, true) {
                run_op(&peer_ctx, op).await?;
            }
        }
        Some(to_link(&existing_link(&peer_ctx, &spec.peer_name).await?))
    };
    Ok((to_link(&existing_link(ctx, &spec.host_name).await?), peer))
}

/// Creates the pair (true), or finds a matching veth named `spec.host_name` (false).
async fn add_veth(ctx: &Ctx, spec: &VethSpec, peer_ns: &std::fs::File) -> Result<bool> {
    let mut peer = LinkUnspec::new_with_name(&spec.peer_name).setns_by_fd(peer_ns.as_raw_fd());
    let mut host = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
        .name(spec.host_name.clone());
    if let Some(mtu) = spec.mtu {
        peer = peer.mtu(mtu);
        host = host.mtu(mtu);
    }
    if let Some(mac) = spec.peer_mac {
        peer = peer.address(mac.0.to_vec());
    }
    if let Some(mac) = spec.host_mac {
        host = host.address(mac.0.to_vec());
    }
    if spec.host_up {
        host = host.up();
    }
    let msg = host
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer.build())))
        .build();
    match ctx.handle.link().add(msg).execute().await {
        Ok(()) => Ok(true),
        Err(e) if nl_errno(&e) == Some(EEXIST) => {
            let what = format!("link {}", spec.host_name);
            let conflict = |detail: String| Error::Conflict {
                what: what.clone(),
                netns: ctx.netns.to_string(),
                detail,
            };
            let Some(existing) = get_link(ctx, &spec.host_name).await?.map(|m| to_link(&m)) else {
                return Err(conflict(format!(
                    "peer {} exists in {}",
                    spec.peer_name,
                    spec.peer_netns.display()
                )));
            };
            if existing.kind.as_deref() != Some("veth") {
                return Err(conflict(format!("kind {:?}, not veth", existing.kind)));
            }
            if let Some(mtu) = spec.mtu {
                if existing.mtu != mtu {
                    return Err(conflict(format!("mtu {} (asked {mtu})", existing.mtu)));
                }
            }
            if let (Some(mac), Some(have)) = (spec.host_mac, existing.mac) {
                if mac != have {
                    return Err(conflict(format!("mac {have} (asked {mac})")));
                }
            }
            Ok(false)
        }
        Err(e) => Err(Error::netlink(
            "add veth",
            spec.host_name.clone(),
            &ctx.netns,
            e,
        )),
    }
}

/// Writes sysctl `key` in the calling thread's namespace; with `missing_ok`, an absent key is success.
fn write_sysctl(netns: &str, key: &str, value: &str, missing_ok: bool) -> Result<()> {
    let path = sysctl_path(key)?;
    match std::fs::write(&path, value.as_bytes()) {
        Ok(()) => Ok(()),
        Err(e) if missing_ok && e.raw_os_error() == Some(ENOENT) => Ok(()),
        Err(e) => Err(Error::io(
            "write sysctl",
            path.display().to_string(),
            netns,
            e,
        )),
    }
}

/// A step that acts on the calling thread's namespace ([`NetOp::runs_in_thread_netns`]); others are no-ops.
fn run_thread_op(netns: &str, op: &NetOp) -> Result<()> {
    match op {
        NetOp::Sysctl {
            key,
            value,
            missing_ok,
        } => write_sysctl(netns, key, value, *missing_ok),
        NetOp::TxChecksumOff { link } => ethtool::tx_checksum_off(netns, link),
        _ => Ok(()),
    }
}

/// One [`NetOp`] on the namespace's thread (validated by the caller).
async fn run_op(ctx: &Ctx, op: &NetOp) -> Result<()> {
    match op {
        // /proc/sys/net and generic netlink sockets resolve against the calling thread's namespace: this is
        // the worker thread.
        NetOp::Sysctl { .. } | NetOp::TxChecksumOff { .. } => run_thread_op(&ctx.netns, op),
        NetOp::SetUp { link, up } => {
            let b = LinkUnspec::new_with_name(link);
            let msg = if *up { b.up() } else { b.down() }.build();
            set_link(ctx, link, "set link up/down", msg).await
        }
        NetOp::SetMtu { link, mtu } => {
            let msg = LinkUnspec::new_with_name(link).mtu(*mtu).build();
            set_link(ctx, link, "set link mtu", msg).await
        }
        NetOp::SetMac { link, mac } => {
            let msg = LinkUnspec::new_with_name(link)
                .address(mac.0.to_vec())
                .build();
            set_link(ctx, link, "set link mac", msg).await
        }
        NetOp::AddAddress { link, addr, no_dad } => {
            let index = link_index(ctx, link).await?;
            let mut req = ctx.handle.address().add(index, addr.ip(), addr.prefix());
            if *no_dad && addr.is_ipv6() {
                req.message_mut().header.flags |= AddressHeaderFlags::Nodad;
            }
            match req.execute().await {
                Ok(()) => Ok(()),
                Err(e) if nl_errno(&e) == Some(EEXIST) => Ok(()),
                Err(e) => Err(Error::netlink(
                    "add address",
                    format!("{addr} dev {link}"),
                    &ctx.netns,
                    e,
                )),
            }
        }
        NetOp::AddRoute(spec) => add_route(ctx, spec).await,
        NetOp::Ipv6AddrGenNone { link } => {
            let msg = LinkUnspec::new_with_name(link)
                .append_extra_attribute(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(
                    vec![AfSpecInet6::AddrGenMode(In6AddrGenMode::None)],
                )]))
                .build();
            match set_link(ctx, link, "set addrgenmode none", msg).await {
                // No IPv6 in this kernel: nothing generates addresses.
                Err(Error::Netlink {
                    errno: Some(EAFNOSUPPORT),
                    ..
                }) => Ok(()),
                r => r,
            }
        }
    }
}

/// Adds a route; the same route present is success, another one to the destination a conflict.
async fn add_route(ctx: &Ctx, spec: &RouteSpec) -> Result<()> {
    let dst = spec.normalized_dst()?;
    let oif = match &spec.dev {
        Some(d) => Some(link_index(ctx, d).await?),
        None => None,
    };
    let msg = route_message(dst, spec.gateway, oif, false);
    match ctx.handle.route().add(msg).execute().await {
        Ok(()) => Ok(()),
        Err(e) if nl_errno(&e) == Some(EEXIST) => {
            let routes = dump_routes(ctx).await?;
            let same = routes.iter().any(|r| {
                r.dst == dst && r.gateway == spec.gateway && (oif.is_none() || r.oif == oif)
            });
            if same {
                return Ok(());
            }
            let have: Vec<String> = routes
                .iter()
                .filter(|r| r.dst == dst)
                .map(|r| format!("via {:?} oif {:?}", r.gateway, r.oif))
                .collect();
            Err(Error::Conflict {
                what: format!("route {dst}"),
                netns: ctx.netns.to_string(),
                detail: have.join(", "),
            })
        }
        Err(e) => Err(Error::netlink("add route", spec.to_string(), &ctx.netns, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_the_create_request_did_are_recognised() {
        let mac: Mac = "0a:00:00:00:00:01".parse().unwrap();
        let other: Mac = "0a:00:00:00:00:02".parse().unwrap();
        let spec = VethSpec::new("h0", "eth0", "/x")
            .mtu(1400)
            .peer_mac(mac)
            .host_up();
        let mtu = |link: &str, mtu| NetOp::SetMtu {
            link: link.into(),
            mtu,
        };
        let set_mac = |link: &str, mac| NetOp::SetMac {
            link: link.into(),
            mac,
        };
        assert!(done_by_create(&spec, &mtu("eth0", 1400), true));
        assert!(done_by_create(&spec, &mtu("h0", 1400), false));
        assert!(!done_by_create(&spec, &mtu("eth0", 1500), true));
        assert!(!done_by_create(&spec, &mtu("lo", 1400), true));
        assert!(done_by_create(&spec, &set_mac("eth0", mac), true));
        assert!(!done_by_create(&spec, &set_mac("eth0", other), true));
        // No host MAC was asked for: a step setting one is not done.
        assert!(!done_by_create(&spec, &set_mac("h0", mac), false));
        assert!(done_by_create(&spec, &NetOp::up("h0"), false));
        // The pod end is created down.
        assert!(!done_by_create(&spec, &NetOp::up("eth0"), true));
        assert!(!done_by_create(
            &VethSpec::new("h0", "eth0", "/x"),
            &NetOp::up("h0"),
            false
        ));
        assert!(!done_by_create(
            &spec,
            &NetOp::ipv6_addr_gen_none("eth0"),
            true
        ));
    }
}

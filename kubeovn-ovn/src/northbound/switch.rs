//! Logical switches and their ports (`ls-add`, `lsp-add`).

use super::{same_strings, strings_datum, Batch, NbError, Northbound, Planner};
use crate::datum::{Atom, Datum};
use crate::error::Error;
use crate::model::Model;
use crate::models::nb;
use crate::ops::{Condition, Operation};
use crate::rowdiff::{map_datum, merged, Map};

type Ls = nb::LogicalSwitch;
type Lsp = nb::LogicalSwitchPort;

crate::string_enum! {
    /// The `type` of a logical switch port, as ovn-nb(5) documents it (the schema leaves the column free:
    /// a type a newer OVN adds reads as `Unknown`).
    PortType {
        "A VIF (an empty `type`): a VM's or pod's interface." Vif = "",
        "`router`: a connection to a logical router port (`options:router-port`)." Router = "router",
        "`localnet`: a connection to a physical network (`options:network_name`)." Localnet = "localnet",
        "`localport`: a port present on every chassis, never leaving it (metadata)." Localport = "localport",
        "`l2gateway`: a connection to a physical network through one chassis." L2gateway = "l2gateway",
        "`vtep`: a port of a VTEP gateway." Vtep = "vtep",
        "`external`: a port for hosts outside OVN served by an HA chassis group." External = "external",
        "`virtual`: a virtual IP claimed by one of `options:virtual-parents`." Virtual = "virtual",
        "`remote`: a port of another availability zone (OVN interconnection)." Remote = "remote",
    }
}

/// `ls-add`: a logical switch, with Kube-OVN's `other_config:subnet` and `exclude_ips`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogicalSwitch {
    /// Name.
    pub name: String,
    /// `other_config` keys to set (subnet, exclude_ips, ...).
    pub other_config: Map,
    /// `external_ids` keys to set.
    pub external_ids: Map,
}

impl LogicalSwitch {
    /// A switch named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        LogicalSwitch {
            name: name.into(),
            ..Default::default()
        }
    }
    /// `other_config:subnet`.
    pub fn subnet(self, cidr: impl Into<String>) -> Self {
        self.other_config("subnet", cidr)
    }
    /// `other_config:exclude_ips`, space separated.
    pub fn exclude_ips<I: IntoIterator<Item = S>, S: Into<String>>(self, ips: I) -> Self {
        let v: Vec<String> = ips.into_iter().map(Into::into).collect();
        self.other_config("exclude_ips", v.join(" "))
    }
    /// One `other_config` key.
    pub fn other_config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.other_config.insert(key.into(), value.into());
        self
    }
    ext_ids!();
    execute!();
}

/// `lsp-add`: a logical switch port; unset fields are left as they are on an existing port.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SwitchPort {
    /// The switch.
    pub switch: String,
    /// The port's name.
    pub name: String,
    /// `addresses` ("MAC IP..." entries, "router", "dynamic", "unknown").
    pub addresses: Option<Vec<String>>,
    /// `port_security`.
    pub port_security: Option<Vec<String>>,
    /// `type`.
    pub port_type: Option<PortType>,
    /// `options` keys to set.
    pub options: Map,
    /// `external_ids` keys to set.
    pub external_ids: Map,
    /// If false, an existing port is an error (default true: update it).
    pub may_exist: bool,
}

impl SwitchPort {
    /// Port `name` on switch `switch`.
    pub fn new(switch: impl Into<String>, name: impl Into<String>) -> Self {
        SwitchPort {
            switch: switch.into(),
            name: name.into(),
            may_exist: true,
            ..Default::default()
        }
    }
    /// `lsp-set-addresses`.
    pub fn addresses<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Self {
        self.addresses = Some(a.into_iter().map(Into::into).collect());
        self
    }
    /// `lsp-set-port-security`.
    pub fn port_security<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Self {
        self.port_security = Some(a.into_iter().map(Into::into).collect());
        self
    }
    /// `lsp-set-type`.
    pub fn port_type(mut self, t: PortType) -> Self {
        self.port_type = Some(t);
        self
    }
    /// One `options` key.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.insert(key.into(), value.into());
        self
    }
    /// `--may-exist`: an existing port is updated (the default).
    pub fn may_exist(mut self) -> Self {
        self.may_exist = true;
        self
    }
    /// Without `--may-exist`: an existing port is an error.
    pub fn must_not_exist(mut self) -> Self {
        self.may_exist = false;
        self
    }
    ext_ids!();
    execute!();
}

impl Planner<'_, '_> {
    pub(super) fn switch(&mut self, s: &LogicalSwitch) -> Result<(), Error> {
        match self.find(Ls::TABLE, &s.name).cloned() {
            Some(row) => {
                let mut cols = Vec::new();
                if let Some(m) = merged(row.get(Ls::OTHER_CONFIG), &s.other_config) {
                    cols.push((Ls::OTHER_CONFIG, map_datum(&m)));
                }
                Self::ext_ids(&mut cols, &row, &s.external_ids);
                self.update(Ls::TABLE, row.uuid(), cols);
            }
            None if self.new_switches.contains(&s.name) => {}
            None => {
                let ins = Operation::insert(Ls::TABLE)
                    .value(Ls::NAME, s.name.as_str())
                    .value(Ls::OTHER_CONFIG, map_datum(&s.other_config))
                    .value(Ls::EXTERNAL_IDS, map_datum(&s.external_ids));
                self.push_insert(Ls::TABLE, ins.into());
                self.new_switches.insert(s.name.clone());
            }
        }
        Ok(())
    }

    pub(super) fn delete_switch(&mut self, name: &str) -> Result<(), Error> {
        self.delete_named(Ls::TABLE, name);
        Ok(())
    }

    pub(super) fn switch_port(&mut self, p: &SwitchPort) -> Result<(), Error> {
        if let Some(row) = self.find(Lsp::TABLE, &p.name).cloned() {
            if !p.may_exist {
                return Err(NbError::Exists {
                    table: Lsp::TABLE,
                    name: p.name.clone(),
                }
                .into());
            }
            let mut cols = Vec::new();
            if let Some(a) = &p.addresses {
                if !same_strings(row.get(Lsp::ADDRESSES), a) {
                    cols.push((Lsp::ADDRESSES, strings_datum(a)));
                }
            }
            if let Some(a) = &p.port_security {
                if !same_strings(row.get(Lsp::PORT_SECURITY), a) {
                    cols.push((Lsp::PORT_SECURITY, strings_datum(a)));
                }
            }
            if let Some(t) = &p.port_type {
                if row.get_str(Lsp::TYPE) != t.as_str() {
                    cols.push((Lsp::TYPE, Datum::from(t)));
                }
            }
            if let Some(m) = merged(row.get(Lsp::OPTIONS), &p.options) {
                cols.push((Lsp::OPTIONS, map_datum(&m)));
            }
            Self::ext_ids(&mut cols, &row, &p.external_ids);
            self.update(Lsp::TABLE, row.uuid(), cols);
            return Ok(());
        }
        if self.new_names.contains_key(&(Lsp::TABLE, p.name.clone())) {
            return Ok(());
        }
        let new_switches = std::mem::take(&mut self.new_switches);
        let r = self.need(Ls::TABLE, &p.switch, &new_switches);
        self.new_switches = new_switches;
        r?;
        let n = self.named();
        let mut ins = Operation::insert(Lsp::TABLE)
            .uuid_name(&n)
            .value(Lsp::NAME, p.name.as_str());
        if let Some(a) = &p.addresses {
            ins = ins.value(Lsp::ADDRESSES, strings_datum(a));
        }
        if let Some(a) = &p.port_security {
            ins = ins.value(Lsp::PORT_SECURITY, strings_datum(a));
        }
        if let Some(t) = &p.port_type {
            ins = ins.value(Lsp::TYPE, t);
        }
        if !p.options.is_empty() {
            ins = ins.value(Lsp::OPTIONS, map_datum(&p.options));
        }
        if !p.external_ids.is_empty() {
            ins = ins.value(Lsp::EXTERNAL_IDS, map_datum(&p.external_ids));
        }
        self.push_insert(Lsp::TABLE, ins.into());
        self.txn.push(
            Operation::mutate(Ls::TABLE)
                .filter(Condition::eq(Ls::NAME, p.switch.as_str()))
                .insert(Ls::PORTS, Datum::named_uuid(&n)),
        );
        self.new_names.insert((Lsp::TABLE, p.name.clone()), n);
        Ok(())
    }

    pub(super) fn delete_switch_port(&mut self, name: &str) -> Result<(), Error> {
        if let Some(row) = self.find(Lsp::TABLE, name).cloned() {
            let u = row.uuid();
            // Name the parent by UUID when the replica knows it (cheaper for the server than a scan).
            let parent = self
                .view
                .rows(Ls::TABLE)
                .find(|ls| {
                    ls.get(Ls::PORTS)
                        .is_some_and(|d| d.atoms().contains(&Atom::Uuid(u)))
                })
                .map(|ls| ls.uuid());
            let m = Operation::mutate(Ls::TABLE);
            let m = match parent {
                Some(p) => m.uuid(p),
                None => m.filter(Condition::includes(Ls::PORTS, Datum::uuid(u))),
            };
            self.txn.push(m.delete(Ls::PORTS, Datum::uuid(u)));
            self.deletes.push((Lsp::TABLE, u));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_types() {
        assert_eq!("".parse(), Ok(PortType::Vif));
        assert_eq!(PortType::Localnet.to_string(), "localnet");
        assert!("bogus".parse::<PortType>().is_err());
        assert_eq!(PortType::default(), PortType::Vif);
    }
}

//! Port groups and their membership, and address sets (`pg-add`, `pg-set-ports`, address sets).

use std::collections::HashSet;

use super::{same_strings, strings_datum, Batch, NbError, Northbound, Planner};
use crate::datum::{Atom, Datum};
use crate::error::Error;
use crate::model::Model;
use crate::models::nb;
use crate::ops::{Condition, Operation};
use crate::rowdiff::{map_datum, Map};
use crate::uuid::Uuid;

type Pg = nb::PortGroup;
type As = nb::AddressSet;
type Lsp = nb::LogicalSwitchPort;

/// `pg-add`: a port group (membership: [`Batch::port_group_add_ports`], or exact with [`PortGroup::ports`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortGroup {
    /// Name.
    pub name: String,
    /// `external_ids` keys to set.
    pub external_ids: Map,
    /// Exactly these switch ports (by name) if set; ports not in NB are left out (a pod's port can go
    /// before its owner learns it).
    pub ports: Option<Vec<String>>,
}

impl PortGroup {
    /// A port group named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        PortGroup {
            name: name.into(),
            external_ids: Map::new(),
            ports: None,
        }
    }
    /// Sets the membership to exactly `ports` (only the difference is sent, as mutations).
    pub fn ports<I: IntoIterator<Item = S>, S: Into<String>>(mut self, ports: I) -> Self {
        self.ports = Some(ports.into_iter().map(Into::into).collect());
        self
    }
    ext_ids!();
    execute!();
}

/// An address set with exactly these addresses (a change is sent as mutations of the difference, so a
/// member joining a set of thousands costs one small operation).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AddressSet {
    /// Name.
    pub name: String,
    /// Addresses.
    pub addresses: Vec<String>,
    /// `external_ids` keys to set.
    pub external_ids: Map,
}

impl AddressSet {
    /// Address set `name` holding `addresses`.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(
        name: impl Into<String>,
        addresses: I,
    ) -> Self {
        AddressSet {
            name: name.into(),
            addresses: addresses.into_iter().map(Into::into).collect(),
            external_ids: Map::new(),
        }
    }
    ext_ids!();
    execute!();
}

impl Planner<'_, '_> {
    pub(super) fn port_group(&mut self, g: &PortGroup) -> Result<(), Error> {
        match self.find(Pg::TABLE, &g.name).cloned() {
            Some(row) => {
                let mut cols = Vec::new();
                Self::ext_ids(&mut cols, &row, &g.external_ids);
                self.update(Pg::TABLE, row.uuid(), cols);
                if let Some(want) = &g.ports {
                    let have: HashSet<Uuid> = row.uuids(Pg::PORTS).collect();
                    let (want, new) = self.port_atoms(want);
                    let add: Vec<Atom> = want
                        .iter()
                        .filter(|u| !have.contains(u))
                        .map(|u| Atom::Uuid(*u))
                        .chain(new)
                        .collect();
                    let del: Vec<Atom> = have
                        .iter()
                        .filter(|u| !want.contains(u))
                        .map(|u| Atom::Uuid(*u))
                        .collect();
                    self.mutate_set(Pg::TABLE, row.uuid(), Pg::PORTS, add, del);
                }
            }
            None if self.new_names.contains_key(&(Pg::TABLE, g.name.clone())) => {}
            None => {
                let n = self.named();
                let mut ins = Operation::insert(Pg::TABLE)
                    .uuid_name(&n)
                    .value(Pg::NAME, g.name.as_str())
                    .value(Pg::EXTERNAL_IDS, map_datum(&g.external_ids));
                if let Some(want) = &g.ports {
                    let (have, new) = self.port_atoms(want);
                    let atoms = have.into_iter().map(Atom::Uuid).chain(new).collect();
                    ins = ins.value(Pg::PORTS, Datum::Set(atoms));
                }
                self.push_insert(Pg::TABLE, ins.into());
                self.new_names.insert((Pg::TABLE, g.name.clone()), n);
            }
        }
        Ok(())
    }

    /// The rows of the switch ports named `names` that exist, and those this batch creates.
    fn port_atoms(&self, names: &[String]) -> (HashSet<Uuid>, Vec<Atom>) {
        let mut have = HashSet::new();
        let mut new = Vec::new();
        for name in names {
            if let Some(n) = self.new_names.get(&(Lsp::TABLE, name.clone())) {
                new.push(Atom::NamedUuid(n.clone()));
            } else if let Some(r) = self.find(Lsp::TABLE, name) {
                have.insert(r.uuid());
            }
        }
        (have, new)
    }

    /// Mutates set column `column` of row `uuid`: inserts `add`, deletes `del` (nothing if both are empty).
    fn mutate_set(
        &mut self,
        table: &'static str,
        uuid: Uuid,
        column: &str,
        add: Vec<Atom>,
        del: Vec<Atom>,
    ) {
        if !del.is_empty() {
            self.txn.push(
                Operation::mutate(table)
                    .uuid(uuid)
                    .delete(column, Datum::Set(del)),
            );
        }
        if !add.is_empty() {
            self.txn.push(
                Operation::mutate(table)
                    .uuid(uuid)
                    .insert(column, Datum::Set(add)),
            );
        }
    }

    pub(super) fn delete_port_group(&mut self, name: &str) -> Result<(), Error> {
        self.delete_named(Pg::TABLE, name);
        Ok(())
    }

    /// Adds (or removes) switch ports, by name, to (from) a port group.
    pub(super) fn port_group_members(
        &mut self,
        group: &str,
        ports: &[String],
        add: bool,
    ) -> Result<(), Error> {
        let pg = self.find(Pg::TABLE, group).cloned();
        if pg.is_none() && !self.new_names.contains_key(&(Pg::TABLE, group.to_owned())) {
            return Err(NbError::NotFound {
                table: Pg::TABLE,
                name: group.to_owned(),
            }
            .into());
        }
        let members: HashSet<Uuid> = pg
            .as_ref()
            .map(|r| r.uuids(Pg::PORTS).collect())
            .unwrap_or_default();
        let mut atoms = Vec::new();
        for name in ports {
            if let Some(n) = self.new_names.get(&(Lsp::TABLE, name.clone())) {
                if add {
                    atoms.push(Atom::NamedUuid(n.clone()));
                }
            } else if let Some(r) = self.find(Lsp::TABLE, name) {
                if members.contains(&r.uuid()) != add {
                    atoms.push(Atom::Uuid(r.uuid()));
                }
            } else if add {
                return Err(NbError::NotFound {
                    table: Lsp::TABLE,
                    name: name.clone(),
                }
                .into());
            }
        }
        if !atoms.is_empty() {
            let m = Operation::mutate(Pg::TABLE).filter(Condition::eq(Pg::NAME, group));
            let m = if add {
                m.insert(Pg::PORTS, Datum::Set(atoms))
            } else {
                m.delete(Pg::PORTS, Datum::Set(atoms))
            };
            self.txn.push(m);
        }
        Ok(())
    }

    pub(super) fn address_set(&mut self, a: &AddressSet) -> Result<(), Error> {
        match self.find(As::TABLE, &a.name).cloned() {
            Some(row) => {
                let mut cols = Vec::new();
                Self::ext_ids(&mut cols, &row, &a.external_ids);
                self.update(As::TABLE, row.uuid(), cols);
                if !same_strings(row.get(As::ADDRESSES), &a.addresses) {
                    let have: HashSet<&str> = row
                        .get(As::ADDRESSES)
                        .map(|d| d.atoms().iter().filter_map(Atom::as_str).collect())
                        .unwrap_or_default();
                    let want: HashSet<&str> = a.addresses.iter().map(String::as_str).collect();
                    let add = want.difference(&have).map(|s| Atom::from(*s)).collect();
                    let del = have.difference(&want).map(|s| Atom::from(*s)).collect();
                    self.mutate_set(As::TABLE, row.uuid(), As::ADDRESSES, add, del);
                }
            }
            None if self.new_names.contains_key(&(As::TABLE, a.name.clone())) => {}
            None => {
                let ins = Operation::insert(As::TABLE)
                    .value(As::NAME, a.name.as_str())
                    .value(As::ADDRESSES, strings_datum(&a.addresses))
                    .value(As::EXTERNAL_IDS, map_datum(&a.external_ids));
                self.push_insert(As::TABLE, ins.into());
                self.new_names
                    .insert((As::TABLE, a.name.clone()), String::new());
            }
        }
        Ok(())
    }

    pub(super) fn delete_address_set(&mut self, name: &str) -> Result<(), Error> {
        self.delete_named(As::TABLE, name);
        Ok(())
    }
}
